"""The node agent over its Unix socket, on the simulated NVML (docs/agent.md).

Each test runs an agent in this process (a server thread on a Unix socket in a
private temporary folder) over a simulated host, talks to it only through the
socket, and stops it (threads joined) at the end. Every socket has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from energyopt.agent import AgentClient, AgentUnavailable, Refused
from energyopt.agent.metrics import MetricsServer
from energyopt.agent.policy import Policy, load_policy
from energyopt.agent.protocol import MAX_MESSAGE_BYTES
from energyopt.agent.server import AgentServer
from energyopt.agent.service import Agent
from energyopt.agent.state import StateDir
from energyopt.agent.watchdog import Watchdog
from energyopt.catalog import builtin_catalog
from energyopt.nvml.actions import Ctx
from energyopt.nvml.errors import NoPermission
from energyopt.nvml.session import Session
from energyopt.nvml.sim import SimClock, SimMps, SimulatedNvml
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse

H100 = "H100-SXM5-80GB"
TIMEOUT_S = 10.0

PLAN: dict[str, Any] = {
    "instance": "agent-test",
    "gpus": [
        {
            "gpu": "n/0",
            "type": H100,
            "on": True,
            "clock_mhz": 1110,
            "power_limit_w": 300,
            "predicted_power_w": 210.0,
            "placements": [{"workload": "chat", "rate_rps": 2.0}],
        },
        {
            "gpu": "n/1",
            "type": H100,
            "on": True,
            "clock_mhz": 1320,
            "power_limit_w": 350,
            "predicted_power_w": 300.0,
            "placements": [{"workload": "chat", "rate_rps": 3.0}],
        },
        {"gpu": "n/2", "type": H100, "on": False},
    ],
}


def policy_data(
    uid: int | None = None, **allow: Any
) -> dict[str, Any]:
    """A policy opening every operation to ``uid`` (this process by default)."""
    me = {"uids": [os.getuid() if uid is None else uid]}
    rules: dict[str, Any] = {
        op: me for op in ("status", "heartbeat", "apply", "set_clock", "set_power_limit", "restore")
    }
    rules.update(allow)
    return {
        "version": 1,
        "gpus": [0, 1, 2],
        "clock_mhz": {"min": 800, "max": 1700},
        "power_limit_w": {"min": 250, "max": 500},
        "allow": rules,
    }


@dataclass
class Running:
    """An agent serving on a socket, with its simulated host."""

    agent: Agent
    server: AgentServer
    sim: SimulatedNvml
    sock: Path
    state: StateDir

    def client(self) -> AgentClient:
        return AgentClient(self.sock, timeout_s=TIMEOUT_S)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short private folder for sockets (a Unix socket path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="eoagent-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def run_agent(tmp_path: Path, sock_dir: Path) -> Iterator[Callable[..., Running]]:
    """Start agents; every one still running is stopped (threads joined) at the end."""
    started: list[tuple[Running, Watchdog | None]] = []

    def start(
        policy: dict[str, Any] | None = None,
        sim: SimulatedNvml | None = None,
        heartbeat_timeout_s: float | None = None,
        restore_on_stop: bool = True,
        mps_dir: str = "mps",
    ) -> Running:
        catalog = builtin_catalog()
        sim = sim or SimulatedNvml([catalog.gpu(H100)] * 4)
        session = Session(Ctx(sim, SimMps(sim)), SimClock(sim), SimClock(sim), "test")
        agent = Agent(
            session,
            parse(Policy, policy or policy_data(), "policy"),
            StateDir(tmp_path / "state"),
            catalog,
            mps_dir=str(tmp_path / mps_dir),
            restore_on_stop=restore_on_stop,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )
        agent.start()
        server = AgentServer(agent, sock_dir / f"agent{len(started)}.sock", idle_timeout_s=30)
        server.start()
        watchdog = Watchdog(agent, heartbeat_timeout_s) if heartbeat_timeout_s else None
        if watchdog is not None:
            watchdog.start()
        running = Running(agent, server, sim, server.path, agent.dirs)
        started.append((running, watchdog))
        return running

    yield start
    for running, watchdog in started:
        if watchdog is not None:
            watchdog.stop()
        running.server.stop()


def locked(sim: SimulatedNvml, index: int) -> Any:
    return sim.get_locked_clocks(index)


def raw_exchange(path: Path, payload: bytes) -> list[dict[str, Any]]:
    """Send bytes on a fresh connection, half-close, and read every answer line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT_S)
        s.connect(str(path))
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent closed the connection after an oversized line
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return [json.loads(line) for line in data.splitlines() if line]


def test_apply_boost_restore_round_trip(run_agent: Callable[..., Running]) -> None:
    """A plan applied, a boost and its restore, then every original put back."""
    r = run_agent()
    before = r.sim.snapshot()
    with r.client() as c:
        with pytest.raises(Refused) as no_plan:
            c.set_clock("n/0", 1410)
        assert no_plan.value.code == "no_plan"
        assert r.sim.writes == []
        out = c.apply(PLAN)
        assert out["plan_id"].startswith("agent-test@")
        assert out["checkpoint"] is not None and Path(out["checkpoint"]).exists()
        assert locked(r.sim, 0) == (1110, 1110) and locked(r.sim, 1) == (1320, 1320)
        assert r.sim.get_power_limit(1) == 350_000
        # the envelope: the policy's clock range, power limit up to the plan's own
        assert out["envelope"]["n/1"] == {"clock_mhz": [800, 1700], "power_limit_w": [250, 350]}
        boost = c.set_clock("n/1", 1410)
        assert boost["previous"] == [1320, 1320]
        assert locked(r.sim, 1) == (1410, 1410)
        assert c.status()["gpus"][1]["online"] == {"lock_clocks": [1410, 1410]}
        c.set_clock("n/1", 1320)  # the online control's restore
        assert c.status()["gpus"][1]["online"] == {}
        c.set_power_limit(1, 300)  # by NVML index
        assert r.sim.get_power_limit(1) == 300_000
        status = c.status()
        assert status["plan_id"] == out["plan_id"]
        assert status["gpus"][0]["plan"]["predicted_power_w"] == 210.0
        restored = c.restore()
        assert restored["checked"] > 0
        assert c.status()["plan_id"] is None
    assert r.sim.snapshot() == before


def test_refusals_reach_no_nvml(run_agent: Callable[..., Running]) -> None:
    """Every refused request answers a code and a reason and writes nothing."""
    r = run_agent(policy_data(set_power_limit={"uids": [os.getuid() + 1]}))
    with r.client() as c:
        c.apply(PLAN)
        writes = len(r.sim.writes)
        cases: list[tuple[Callable[[], Any], str, str]] = [
            (lambda: c.set_clock("n/0", 1800), "outside_policy", "policy's range 800-1700"),
            (lambda: c.set_clock("n/0", 1111), "not_supported", "nearest"),
            (lambda: c.set_clock("n/2", 1110), "outside_envelope", "off in the plan"),
            (lambda: c.set_clock("n/9", 1110), "outside_envelope", "not a GPU of the plan"),
            (lambda: c.set_power_limit("n/0", 200), "unauthorized", f"uid {os.getuid()}"),
            (lambda: c.call("set_clock", gpu="n/0"), "bad_request", "clock_mhz"),
            (lambda: c.call("reset_gpu"), "unknown_op", "reset_gpu"),
            (lambda: c.apply({"instance": "x", "gpus": "no"}), "bad_request", "gpus"),
        ]
        for call, code, words in cases:
            with pytest.raises(Refused) as exc:
                call()
            assert exc.value.code == code, exc.value.reason
            assert words in exc.value.reason
        # a plan outside the policy: its clock, and a GPU the policy does not list
        fast = json.loads(json.dumps(PLAN))
        fast["gpus"][0]["clock_mhz"] = 1755
        with pytest.raises(Refused, match="outside_policy"):
            c.apply(fast)
        four = json.loads(json.dumps(PLAN))
        four["gpus"].append({**PLAN["gpus"][1], "gpu": "n/3"})
        with pytest.raises(Refused, match=r"GPU 3 .* not one the policy lets"):
            c.apply(four)
        # an envelope wider than the policy
        with pytest.raises(Refused, match="outside_policy"):
            c.apply(PLAN, envelope={"n/0": {"clock_mhz": [600, 1400]}})
    assert len(r.sim.writes) == writes
    # the power limit above the plan's is outside the envelope (with a peer allowed)
    r2 = run_agent()
    with r2.client() as c:
        c.apply(PLAN)
        with pytest.raises(Refused) as exc:
            c.set_power_limit("n/0", 320)
        assert exc.value.code == "outside_envelope" and "[250, 300] W" in exc.value.reason
    refused = r.agent.stats.refusals
    assert refused[("set_clock", "outside_policy")] == 1
    assert refused[("set_power_limit", "unauthorized")] == 1


def test_malformed_versions_and_oversized_lines(run_agent: Callable[..., Running]) -> None:
    r = run_agent()
    answers = raw_exchange(
        r.sock,
        b"not json\n"
        b"[1, 2]\n"
        b'{"v": 2, "id": 1, "op": "status"}\n'
        b'{"v": 1, "id": 2, "op": "status", "extra": 1}\n'
        b'{"v": 1, "id": 3, "op": "status"}\n',
    )
    assert [a["ok"] for a in answers] == [False, False, False, False, True]
    assert [a.get("error", {}).get("code") for a in answers[:4]] == [
        "bad_request",
        "bad_request",
        "unsupported_version",
        "bad_request",
    ]
    assert "protocol version 1" in answers[2]["error"]["reason"]
    assert answers[4]["id"] == 3
    big = b'{"v": 1, "op": "status", "args": {"pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}}\n'
    answers = raw_exchange(r.sock, big)
    assert len(answers) == 1 and answers[0]["error"]["code"] == "oversized"
    # the agent still serves
    with r.client() as c:
        assert c.status()["backend"] == "sim"
    assert r.sim.writes == []


def test_unauthorized_peer_by_peercred(run_agent: Callable[..., Running]) -> None:
    """The policy is checked against the uid the kernel reports for the peer."""
    r = run_agent(policy_data(uid=os.getuid() + 1, status="any"))
    with r.client() as c:
        assert c.status()["gpus"]  # open to any peer
        for call in (lambda: c.apply(PLAN), c.restore, c.heartbeat):
            with pytest.raises(Refused) as exc:
                call()
            assert exc.value.code == "unauthorized"
            assert f"uid {os.getuid()}" in exc.value.reason
    assert r.sim.writes == []


def test_device_failure_rolls_back(run_agent: Callable[..., Running]) -> None:
    """NVML refusing the 4th write of an apply: refused as device_error, all undone."""
    r = run_agent()
    before = r.sim.snapshot()
    r.sim.fail_at_write(3, NoPermission("GPU 1", "power limit"))
    with r.client() as c:
        with pytest.raises(Refused) as exc:
            c.apply(PLAN)
        assert exc.value.code == "device_error"
        assert "every setting it changed was restored" in exc.value.reason
        assert c.status()["plan_id"] is None
    assert r.sim.snapshot() == before
    assert r.agent.stats.rollbacks == 1


class Crash(BaseException):
    """The agent process dying in the middle of a write (nothing catches it)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_crash_mid_apply_and_restart(run_agent: Callable[..., Running]) -> None:
    """The agent dies half-way through applying a second plan; a new agent on the same
    state folder puts the GPUs back at the first plan, and restore still reaches the
    originals from before any apply."""
    r = run_agent()
    original = r.sim.snapshot()
    with r.client() as c:
        c.apply(PLAN)
        c.set_clock("n/0", 1410)  # an online change in force when it dies
    at_plan = [dict(row) for row in r.sim.snapshot()]
    at_plan[0]["locked"] = (1110, 1110)
    second = json.loads(json.dumps(PLAN))
    second["gpus"][0]["clock_mhz"] = 885
    second["gpus"][1]["power_limit_w"] = 260
    second["gpus"][1]["clock_mhz"] = 1005
    r.sim.fail_at_write(2, Crash())  # the boost goes back, one write, then it dies
    with r.client() as c, pytest.raises(AgentUnavailable):  # the connection dropped
        c.apply(second)
    state = json.loads(r.state.file.read_text())
    assert state["applying"] is not None  # the marker was on disk before the first write
    assert Path(state["applying_checkpoint"]).exists()  # and so was the checkpoint
    assert r.sim.snapshot() != at_plan  # the dead apply left the GPUs half-changed
    r.server.stop()

    again = run_agent(sim=r.sim)
    assert any("cut short" in note for note in again.agent.reconcile_notes)
    assert r.sim.snapshot() == at_plan
    with again.client() as c:
        assert c.status()["plan_id"].startswith("agent-test@")
        c.restore()
    assert r.sim.snapshot() == original


def test_restart_returns_online_changes_to_the_plan(run_agent: Callable[..., Running]) -> None:
    """An agent that dies with a boost in force: the next one sets the plan's clock and
    its checkpoint still leads back to the originals (not to the boost)."""
    r = run_agent()
    original = r.sim.snapshot()
    with r.client() as c:
        c.apply(PLAN)
        c.set_clock("n/1", 1410)
        c.set_power_limit("n/1", 300)
    r.server.stop()  # dies: no restore
    again = run_agent(sim=r.sim)
    assert locked(r.sim, 1) == (1320, 1320) and r.sim.get_power_limit(1) == 350_000
    with again.client() as c:
        c.restore()
    assert r.sim.snapshot() == original


def test_stop_restores_unless_configured(run_agent: Callable[..., Running]) -> None:
    r = run_agent()
    original = r.sim.snapshot()
    with r.client() as c:
        c.apply(PLAN)
    r.server.stop()
    r.agent.stop()
    assert r.sim.snapshot() == original
    kept = run_agent(sim=r.sim, restore_on_stop=False)
    with kept.client() as c:
        c.apply(PLAN)
    kept.server.stop()
    kept.agent.stop()
    assert locked(r.sim, 0) == (1110, 1110)


def test_watchdog_returns_to_plan_when_heartbeats_stop(run_agent: Callable[..., Running]) -> None:
    r = run_agent(heartbeat_timeout_s=0.3)
    with r.client() as c:
        c.apply(PLAN)
        c.set_clock("n/0", 1410)
        c.set_power_limit("n/1", 300)
        for _ in range(4):  # heartbeats keep the boost
            time.sleep(0.1)
            c.heartbeat()
        assert locked(r.sim, 0) == (1410, 1410)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not c.status()["watchdog_fired"]:
            time.sleep(0.05)
        assert c.status()["watchdog_fired"]
        assert locked(r.sim, 0) == (1110, 1110)
        assert r.sim.get_power_limit(1) == 350_000
        assert r.agent.stats.watchdog_fallbacks == 1
        c.set_clock("n/0", 1410)  # a heartbeat arms it again
        assert not c.status()["watchdog_fired"]


def test_concurrent_clients_are_serialized_per_gpu(run_agent: Callable[..., Running]) -> None:
    """Eight clients switch two GPUs' clocks at once: every request answered, and each
    GPU's answers form one chain (each write saw the value the one before it left)."""
    r = run_agent()
    with r.client() as c:
        c.apply(PLAN)
    clocks = {0: (1110, 1410), 1: (1320, 1410)}
    answers: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    errors: list[BaseException] = []
    guard = threading.Lock()

    def work(k: int) -> None:
        gpu = k % 2
        try:
            with r.client() as c:
                for j in range(25):
                    target = clocks[gpu][(j + k // 2) % 2]
                    out = c.set_clock(gpu, target)
                    with guard:
                        answers[gpu].append((out["previous"][0], target))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 3)
    assert not errors and not any(t.is_alive() for t in threads)
    for gpu, pairs in answers.items():
        assert len(pairs) == 100
        changes = sum(prev != target for prev, target in pairs)
        # each change is one write: none lost, none doubled
        assert sum(w == f"set_locked_clocks[{gpu}]" for w in r.sim.writes) == changes + 1
        assert locked(r.sim, gpu)[0] in clocks[gpu]


def test_metrics_endpoint(run_agent: Callable[..., Running]) -> None:
    r = run_agent()
    metrics = MetricsServer(r.agent, "127.0.0.1", 0)
    try:
        with r.client() as c:
            c.apply(PLAN)
            c.set_clock("n/1", 1410)
            with pytest.raises(Refused):
                c.set_clock("n/1", 1800)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{metrics.port}/metrics", timeout=TIMEOUT_S
        ) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    gpu1 = {"gpu": "1", "uuid": r.sim.uuid(1), "plan_gpu": "n/1"}
    assert value("energyopt_gpu_sm_clock_mhz", **gpu1) == 1410
    assert value("energyopt_gpu_locked_clock_mhz", **gpu1, bound="max") == 1410
    assert value("energyopt_gpu_plan_clock_mhz", **gpu1) == 1320
    assert value("energyopt_gpu_power_limit_watts", **gpu1) == 350
    assert value("energyopt_gpu_predicted_power_watts", **gpu1) == 300
    assert value("energyopt_gpu_power_watts", **gpu1) == pytest.approx(
        r.sim.get_power_usage(1) / 1000
    )
    assert value("energyopt_gpu_energy_joules_total", **gpu1) >= 0
    assert value("energyopt_gpu_online_change", **gpu1, setting="lock_clocks") == 1
    share = {"workload": "chat", "phase": "both", "mig_profile": ""}
    assert value("energyopt_gpu_plan_share_percent", **gpu1, **share) == 100
    assert value("energyopt_plan_info", plan_id=r.agent.status()["plan_id"]) == 1
    assert value("energyopt_agent_requests_total", op="set_clock") == 2
    assert value("energyopt_agent_refusals_total", op="set_clock", code="outside_policy") == 1
    assert value("energyopt_agent_rollbacks_total") == 0


def test_policy_file_errors_name_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ngpus: all\nclock_mhz: {min: 1500, max: 900}\n"
        "power_limit_w: {min: 200, max: 400}\nallow: {set_clok: any}\n"
    )
    with pytest.raises(SpecError) as exc:
        load_policy(path)
    text = "\n".join(exc.value.problems)
    assert f"{path}: clock_mhz" in text and "above max" in text
    path.write_text(
        "version: 1\ngpus: all\nclock_mhz: {min: 900, max: 1500}\n"
        "power_limit_w: {min: 200, max: 400}\nallow: {set_clok: any}\n"
    )
    with pytest.raises(SpecError, match="set_clok"):
        load_policy(path)
    path.write_text("version: 2\n")
    with pytest.raises(SpecError, match=f"{path}: version"):
        load_policy(path)


def test_docs_policy_and_dashboard_match_the_agent(run_agent: Callable[..., Running]) -> None:
    """The example policy loads, and every metric the example dashboard queries is one
    the agent exports (names read from a scrape of an agent with a plan in force)."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "agent"
    policy = load_policy(docs / "policy.yaml")
    assert policy.allow["apply"] != "any"
    r = run_agent()
    metrics = MetricsServer(r.agent, "127.0.0.1", 0)
    try:
        with r.client() as c:
            c.apply(PLAN)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{metrics.port}/metrics", timeout=TIMEOUT_S
        ) as resp:
            families = list(text_string_to_metric_families(resp.read().decode()))
        # a family is exported (with its HELP and TYPE) even while it has no samples
        exported = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    finally:
        metrics.stop()
    dashboard = json.loads((docs / "grafana-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"energyopt_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported


def test_readback_failure_of_an_online_change_is_put_back(
    run_agent: Callable[..., Running],
) -> None:
    """The simulated driver accepting a clock lock without effect: device_error, the GPU
    still at the plan's clock, a rollback counted."""
    r = run_agent()
    with r.client() as c:
        c.apply(PLAN)
        r.sim.ignore("set_locked_clocks")
        with pytest.raises(Refused) as exc:
            c.set_clock("n/0", 1410)
        assert exc.value.code == "device_error" and "read back" in exc.value.reason
        assert c.status()["gpus"][0]["online"] == {}
    assert locked(r.sim, 0) == (1110, 1110)
    assert r.agent.stats.rollbacks == 1


def test_online_change_of_a_setting_no_checkpoint_records(
    run_agent: Callable[..., Running],
) -> None:
    """GPUs already at the plan when the agent first applies it: nothing is written and
    no checkpoint made, so the first boost writes a checkpoint before it writes, and
    restore returns to the state the agent found."""
    catalog = builtin_catalog()
    sim = SimulatedNvml([catalog.gpu(H100)] * 4)
    for i, g in enumerate(PLAN["gpus"][:2]):
        sim.set_persistence(i, True)
        sim.set_locked_clocks(i, g["clock_mhz"], g["clock_mhz"])
        sim.set_power_limit(i, g["power_limit_w"] * 1000)
    found = sim.snapshot()
    r = run_agent(sim=sim)
    with r.client() as c:
        assert c.apply(PLAN)["checkpoint"] is None
        writes = len(sim.writes)
        sim.fail_at_write(0, NoPermission("GPU 1", "clocks"))
        with pytest.raises(Refused, match="device_error"):
            c.set_clock("n/1", 1410)
        checkpoints = list(r.state.checkpoints.glob("online-*.json"))
        assert len(checkpoints) == 1  # written before the write that failed
        assert len(sim.writes) == writes + 1
        c.set_clock("n/1", 1410)
        assert locked(sim, 1) == (1410, 1410)
        c.restore()
    assert sim.snapshot() == found


def test_restart_keeps_the_mps_directories_of_the_plan(
    run_agent: Callable[..., Running],
) -> None:
    """A plan with MPS applied, the agent restarted with another --mps-dir: the plan's
    daemons are found where they were, none is started twice."""
    shared = json.loads(json.dumps(PLAN))
    shared["gpus"][0]["placements"] = [
        {"workload": "chat", "rate_rps": 1.0, "share_pct": 50},
        {"workload": "sum", "rate_rps": 1.0, "share_pct": 50},
    ]
    r = run_agent()
    with r.client() as c:
        c.apply(shared)
    daemons = dict(r.sim.mps_daemons)
    assert len(daemons) == 1
    r.server.stop()
    again = run_agent(sim=r.sim, mps_dir="other-mps")
    assert again.agent.reconcile_notes[-1].endswith("every setting is in place")
    assert r.sim.mps_daemons.keys() == daemons.keys()


def test_restart_under_a_narrower_policy_withdraws_the_plan(
    run_agent: Callable[..., Running],
) -> None:
    """The operator lowers the clock range while the agent is down: the plan in force
    (1320 MHz on n/1) is not applied again; the originals come back."""
    r = run_agent()
    original = r.sim.snapshot()
    with r.client() as c:
        c.apply(PLAN)
    r.server.stop()
    narrow = policy_data()
    narrow["clock_mhz"] = {"min": 800, "max": 1200}
    again = run_agent(narrow, sim=r.sim)
    assert "outside the policy now" in again.agent.reconcile_notes[-1]
    assert "1320 MHz" in again.agent.reconcile_notes[-1]
    assert r.sim.snapshot() == original
    with again.client() as c:
        assert c.status()["plan_id"] is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_crash_mid_restore_is_finished_on_restart(run_agent: Callable[..., Running]) -> None:
    r = run_agent()
    original = r.sim.snapshot()
    with r.client() as c:
        c.apply(PLAN)
    r.sim.fail_at_write(2, Crash())
    with r.client() as c, pytest.raises(AgentUnavailable):
        c.restore()
    assert json.loads(r.state.file.read_text())["restoring"] is True
    assert r.sim.snapshot() != original
    r.server.stop()
    again = run_agent(sim=r.sim)
    assert "a restore was cut short" in again.agent.reconcile_notes[-1]
    assert r.sim.snapshot() == original
    with again.client() as c:
        assert c.status()["plan_id"] is None
