"""Random tiny keep-alive instances and an exhaustive optimiser written apart from
the formulations and the verifier, for the differential test of every keep-alive
solver (tests/test_keepalive_differential.py).

The optimiser reads only the file's numbers and prices every plan by the model of
docs/formulations/keepalive.md: a function's states are (kind, node) with kind
warm, tepid (where offered) or cold, on a permitted node; holding state s in
window t costs w_k Delta + lambda_t e_s; a move on one node costs the pause, the
resume or the load (cold -> tepid: load then pause), staying or evicting is free,
and a move onto another node (or from the start) enters from cold there; a move
that takes longer than Delta is impossible. Per node and window the GPU memory,
the host memory and the average power (held states, their requests and the moves
into them, over Delta) stay within the node's budget; each function's late
requests stay within its SLO's allowance (energy objective); cold requests within
the cap. It enumerates every function's state sequences, then every combination,
pruning combinations that already break a budget (usage only grows).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from energyopt.families.keepalive.spec import KeepAliveFile

MAX_COMBINATIONS = 200_000
"""Instances whose enumeration (product of every function's paths) is larger are redrawn."""
TOL = 1e-9


@dataclass(frozen=True)
class Optimum:
    """The exhaustive optimum: for the energy objective the least energy J; for the
    throughput objective the most requests/s within their limit and the least
    energy among those plans. None where no plan keeps every constraint."""

    energy_j: float | None
    throughput_rps: float | None
    combinations: int


@dataclass(frozen=True)
class _Paths:
    """Every admissible path of one function: energy (P,), usage (P, N, T, 3) in GPU
    GB, host GB and W, late and cold requests (P,)."""

    energy: np.ndarray[Any, Any]
    usage: np.ndarray[Any, Any]
    late: np.ndarray[Any, Any]
    cold: np.ndarray[Any, Any]


def _forecast(fn: dict[str, Any], window_s: float) -> list[float]:
    """Expected requests per window: the counts, or window / mean inter-arrival."""
    if "arrivals" in fn:
        return [float(a) for a in fn["arrivals"]]
    h = fn["inter_arrivals"]
    counts = h["counts"]
    mean = h["bin_s"] * sum(c * (i + 0.5) for i, c in enumerate(counts)) / sum(counts)
    return [window_s / mean] * h["windows"]


def _function_paths(doc: dict[str, Any], fn: dict[str, Any]) -> _Paths:
    dt = float(doc["window_s"])
    nodes = [n["name"] for n in doc["nodes"]]
    lam = _forecast(fn, dt)
    n_t = len(lam)
    tep = fn.get("tepid")
    kinds = ["warm", "cold"] + (["tepid"] if tep else [])
    permitted = fn.get("nodes") or nodes
    states = [(k, nodes.index(n)) for k in kinds for n in permitted]
    load = (fn["cold_start"]["energy_j"], fn["cold_start"]["time_s"])
    serve_j = fn["service"]["time_s"] * fn["service"]["power_w"]
    slo = fn.get("slo") or doc.get("slo")
    throughput = doc.get("objective", {}).get("kind") == "throughput"

    def hold(kind: str) -> tuple[float, float, float]:
        """(power W, GPU GB, host GB) while kept."""
        if kind == "warm":
            w = fn["warm"]
            return w["power_w"], w["gpu_memory_gb"], w["host_memory_gb"]
        if kind == "tepid":
            return tep["power_w"], tep["gpu_memory_gb"], tep["host_memory_gb"]
        return 0.0, 0.0, 0.0

    def start(kind: str) -> tuple[float, float]:
        """(energy J, latency s) of one request's start."""
        if kind == "warm":
            return 0.0, 0.0
        if kind == "tepid":
            return tep["resume_j"] + tep["enter_j"], tep["resume_s"]
        return load

    def enter(kind: str) -> tuple[float, float]:
        """Entering ``kind`` from nothing kept on the node."""
        if kind == "warm":
            return load
        if kind == "tepid":
            return load[0] + tep["enter_j"], load[1] + tep["enter_s"]
        return 0.0, 0.0

    def move(a: tuple[str, int] | None, b: tuple[str, int]) -> tuple[float, float]:
        if a is None or a[1] != b[1]:
            return enter(b[0])
        if a[0] == b[0] or b[0] == "cold":
            return 0.0, 0.0
        if (a[0], b[0]) == ("warm", "tepid"):
            return tep["enter_j"], tep["enter_s"]
        if (a[0], b[0]) == ("tepid", "warm"):
            return tep["resume_j"], tep["resume_s"]
        return enter(b[0])  # from cold on the node

    energies, usages, lates, colds = [], [], [], []
    total = sum(lam)
    for seq in itertools.product(states, repeat=n_t):
        energy = late = cold = 0.0
        usage = np.zeros((len(nodes), n_t, 3))
        before: tuple[str, int] | None = None
        possible = True
        for t, s in enumerate(seq):
            m_j, m_s = move(before, s)
            if m_s > dt:
                possible = False
                break
            w, g, h = hold(s[0])
            e_j, e_s = start(s[0])
            window_j = w * dt + lam[t] * (serve_j + e_j) + m_j
            energy += window_j
            usage[s[1], t] += (g, h, window_j / dt)
            if slo is not None and e_s > slo["start_latency_s"]:
                late += lam[t]
            if s[0] == "cold":
                cold += lam[t]
            before = s
        if not possible:
            continue
        allowed = math.inf if slo is None or throughput else (1 - slo["percentile"] / 100) * total
        if late > allowed + TOL * max(1.0, total):
            continue
        energies.append(energy)
        usages.append(usage)
        lates.append(late)
        colds.append(cold)
    return _Paths(
        np.array(energies),
        np.array(usages).reshape(len(energies), len(nodes), n_t, 3),
        np.array(lates),
        np.array(colds),
    )


def path_count(doc: dict[str, Any]) -> int:
    """Combinations the exhaustive search would enumerate before pruning."""
    n_nodes = len(doc["nodes"])
    out = 1
    for fn in doc["functions"]:
        per_node = len(fn.get("nodes") or range(n_nodes))
        kinds = 3 if fn.get("tepid") else 2
        n_t = len(_forecast(fn, float(doc["window_s"])))
        out *= (kinds * per_node) ** n_t
    return out


def exhaustive(doc: dict[str, Any]) -> Optimum:
    """The optimum of the keep-alive file ``doc`` by enumeration."""
    dt = float(doc["window_s"])
    caps = np.array(
        [[n["gpu_memory_gb"], n["host_memory_gb"], n["power_budget_w"]] for n in doc["nodes"]]
    )[:, None, :]
    limit = caps * (1 + TOL) + TOL
    requests = sum(sum(_forecast(fn, dt)) for fn in doc["functions"])
    rate = doc.get("objective", {}).get("max_cold_start_rate")
    cold_cap = np.inf if rate is None else rate * requests + TOL * max(1.0, requests)
    combos = 1
    energy = np.zeros(1)
    usage = np.zeros((1, len(doc["nodes"]), 1, 3))
    late = np.zeros(1)
    cold = np.zeros(1)
    for fn in doc["functions"]:
        paths = _function_paths(doc, fn)
        combos *= max(1, len(paths.energy))
        energy = (energy[:, None] + paths.energy[None, :]).ravel()
        usage = (usage[:, None] + paths.usage[None, :]).reshape(-1, *paths.usage.shape[1:])
        late = (late[:, None] + paths.late[None, :]).ravel()
        cold = (cold[:, None] + paths.cold[None, :]).ravel()
        keep = np.all(usage <= limit[None], axis=(1, 2, 3)) & (cold <= cold_cap)
        energy, usage, late, cold = energy[keep], usage[keep], late[keep], cold[keep]
        if len(energy) == 0:
            return Optimum(None, None, combos)
    n_t = usage.shape[2]
    if doc.get("objective", {}).get("kind") == "throughput":
        fewest = float(late.min())
        at_most = late <= fewest + TOL * max(1.0, requests)
        return Optimum(float(energy[at_most].min()), (requests - fewest) / (n_t * dt), combos)
    best = int(np.argmin(energy))
    return Optimum(float(energy[best]), (requests - float(late[best])) / (n_t * dt), combos)


def random_doc(rng: random.Random) -> dict[str, Any]:
    """A tiny keep-alive file whose budgets, SLOs, cap, permitted nodes and window
    length bind by chance; forecasts as counts or as inter-arrival histograms."""
    n_nodes = rng.choice([1, 2, 2, 3])
    n_windows = rng.choice([2, 3]) if n_nodes < 3 else 2
    window = rng.choice([20.0, 30.0, 60.0])
    nodes = [
        {
            "name": f"n{k}",
            "gpu_memory_gb": rng.choice([60.0, 80.0, 100.0]),
            "host_memory_gb": rng.choice([40.0, 120.0, 400.0]),
            "power_budget_w": rng.uniform(150, 1500),
        }
        for k in range(n_nodes)
    ]
    functions = []
    for i in range(rng.choice([1, 2, 2, 3])):
        warm_gb = rng.choice([20.0, 35.0, 50.0, 70.0])
        fn: dict[str, Any] = {
            "name": f"f{i}",
            "warm": {
                "gpu_memory_gb": warm_gb,
                "host_memory_gb": rng.choice([1.0, 4.0]),
                "power_w": rng.uniform(10, 90),
            },
            "cold_start": {
                "time_s": rng.choice([3.0, 12.0, 25.0, 45.0]),
                "energy_j": rng.uniform(300, 4000),
            },
            "service": {"time_s": rng.uniform(0.5, 3), "power_w": rng.uniform(100, 400)},
        }
        if rng.random() < 0.7:
            fn["tepid"] = {
                "gpu_memory_gb": rng.choice([0.0, 0.5]),
                "host_memory_gb": warm_gb,
                "power_w": rng.uniform(1, 15),
                "enter_s": rng.choice([1.0, 4.0, 18.0]),
                "enter_j": rng.uniform(20, 300),
                "resume_s": rng.choice([2.0, 8.0, 14.0]),
                "resume_j": rng.uniform(50, 2500),
            }
        if rng.random() < 0.8:
            fn["arrivals"] = [rng.randint(0, 6) for _ in range(n_windows)]
        else:
            counts = [rng.randint(0, 3) for _ in range(rng.randint(1, 5))]
            counts[-1] += 1
            fn["inter_arrivals"] = {
                "bin_s": window / rng.choice([2, 4, 8]),
                "counts": counts,
                "windows": n_windows,
            }
        if rng.random() < 0.3:
            fn["slo"] = {
                "start_latency_s": rng.choice([1.0, 5.0, 15.0]),
                "percentile": rng.choice([50.0, 75.0, 99.0]),
            }
        if n_nodes > 1 and rng.random() < 0.3:
            fn["nodes"] = sorted(rng.sample([n["name"] for n in nodes], n_nodes - 1))
        functions.append(fn)
    doc: dict[str, Any] = {
        "kind": "keepalive",
        "name": "random",
        "window_s": window,
        "nodes": nodes,
        "functions": functions,
    }
    if rng.random() < 0.7:
        doc["slo"] = {
            "start_latency_s": rng.choice([5.0, 15.0, 30.0]),
            "percentile": rng.choice([50.0, 80.0, 95.0]),
        }
    objective: dict[str, Any] = {}
    if rng.random() < 0.3:
        objective["max_cold_start_rate"] = rng.choice([0.0, 0.2, 0.5])
    if rng.random() < 0.2:
        objective["kind"] = "throughput"
    if objective:
        doc["objective"] = objective
    return doc


def random_docs(seed: int, count: int) -> list[tuple[dict[str, Any], Optimum]]:
    """``count`` random files small enough to enumerate, each with its optimum."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        doc = random_doc(rng)
        if path_count(doc) > MAX_COMBINATIONS:
            continue
        KeepAliveFile.model_validate(doc)  # the generator writes only valid files
        out.append((doc, exhaustive(doc)))
    return out
