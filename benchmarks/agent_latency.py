"""Latency and throughput of the node agent's set_clock over its Unix socket (simulated NVML).

Usage: python benchmarks/agent_latency.py [--requests 2000] [--clients 1,4]

An agent runs in this process on a simulated host of four H100s with a plan
applied; each client connects once and alternates one GPU's clock between the
plan's clock and a boost (so every request is a write and its read-back). It
prints, side by side, requests per second and the p50 / p99 latency of one
request (send to answer) for:

* ``direct``: ``Agent.handle`` called in this thread (the agent's own work:
  policy and envelope checks, the NVML write and read-back, no socket);
* ``socket``: through ``AgentClient`` over the Unix socket, with 1..N clients
  (client k drives GPU k mod 4, so clients on different GPUs run in parallel);
* ``socket, state saved``: as the CLI runs the simulated backend, saving the
  simulated host to its state file after every write (an fsync'd file write
  that a real GPU does not need).

It is a benchmark, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from energyopt.agent import AgentClient
from energyopt.agent.policy import Policy
from energyopt.agent.server import AgentServer
from energyopt.agent.service import Agent
from energyopt.agent.state import StateDir
from energyopt.catalog import builtin_catalog
from energyopt.nvml.actions import Ctx
from energyopt.nvml.session import Session
from energyopt.nvml.sim import SimClock, SimMps, SimulatedNvml
from energyopt.spec.io import parse

H100 = "H100-SXM5-80GB"
PLAN_CLOCK_MHZ, BOOST_MHZ = 1320, 1410


def plan() -> dict[str, Any]:
    return {
        "instance": "bench",
        "gpus": [
            {
                "gpu": f"n/{i}",
                "type": H100,
                "on": True,
                "clock_mhz": PLAN_CLOCK_MHZ,
                "power_limit_w": 400,
                "placements": [{"workload": "w", "rate_rps": 1.0}],
            }
            for i in range(4)
        ],
    }


def make_agent(folder: Path, save_state: bool) -> tuple[Agent, SimulatedNvml]:
    catalog = builtin_catalog()
    sim = SimulatedNvml([catalog.gpu(H100)] * 4)
    state = folder / "sim.json" if save_state else None
    session = Session(Ctx(sim, SimMps(sim)), SimClock(sim), SimClock(sim), "bench", state)
    me = {"uids": [os.getuid()]}
    policy = parse(
        Policy,
        {
            "version": 1,
            "gpus": "all",
            "clock_mhz": {"min": 300, "max": 2000},
            "power_limit_w": {"min": 200, "max": 700},
            "allow": {"apply": me, "set_clock": me, "status": me},
        },
        "bench policy",
    )
    agent = Agent(session, policy, StateDir(folder / "state"), catalog)
    agent.start()
    agent.handle("apply", {"plan": plan()})
    return agent, sim


def summarize(latencies_s: list[float], wall_s: float) -> tuple[float, float, float]:
    """(requests per second, p50 ms, p99 ms)."""
    ordered = sorted(latencies_s)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return len(ordered) / wall_s, statistics.median(ordered) * 1e3, p99 * 1e3


def run_direct(agent: Agent, n: int) -> tuple[float, float, float]:
    lat = []
    t0 = time.perf_counter()
    for j in range(n):
        clock = BOOST_MHZ if j % 2 == 0 else PLAN_CLOCK_MHZ
        s = time.perf_counter()
        agent.handle("set_clock", {"gpu": "n/0", "clock_mhz": clock})
        lat.append(time.perf_counter() - s)
    return summarize(lat, time.perf_counter() - t0)


def run_socket(path: Path, n: int, clients: int) -> tuple[float, float, float]:
    lat: list[float] = []
    guard = threading.Lock()
    per_client = max(1, n // clients)

    def work(k: int) -> None:
        mine = []
        with AgentClient(path, timeout_s=30) as c:
            for j in range(per_client):
                clock = BOOST_MHZ if j % 2 == 0 else PLAN_CLOCK_MHZ
                s = time.perf_counter()
                c.set_clock(f"n/{k % 4}", clock)
                mine.append(time.perf_counter() - s)
        with guard:
            lat.extend(mine)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return summarize(lat, time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", default="1,4", help="comma-separated client counts")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    rows: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="eoagent-", dir="/tmp") as tmp:
        folder = Path(tmp)
        for save in (False, True):
            sub = folder / ("saved" if save else "plain")
            agent, _ = make_agent(sub, save)
            label = ", state saved" if save else ""
            if not save:
                rows.append(("direct (no socket)", *run_direct(agent, args.requests)))
            server = AgentServer(agent, sub / "a.sock")
            server.start()
            try:
                for clients in counts:
                    name = f"socket, {clients} client{'s' if clients > 1 else ''}{label}"
                    rows.append((name, *run_socket(server.path, args.requests, clients)))
            finally:
                server.stop()
    base = rows[0][2]
    print(f"set_clock, {args.requests} requests per row, simulated NVML (4 x {H100})")
    print(f"{'configuration':34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p50 / direct':>13}")
    for name, rps, p50, p99 in rows:
        print(f"{name:34} {rps:9.0f} {p50:8.3f} {p99:8.3f} {p50 / base:12.1f}x")


if __name__ == "__main__":
    main()
