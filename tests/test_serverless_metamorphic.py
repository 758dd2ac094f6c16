"""Metamorphic tests of the exact serverless solver on random small instances (up to
three nodes, four epochs, two models): relaxing a constraint (more GPUs, no power
cap, faster NICs, more clocks or shares, a looser TTFT SLO, less demand, quicker
cold starts, no drain, one more node) never raises the optimum, and listing the
nodes, models or options in another order never changes it. Every plan verifies."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from energyopt.families import family
from energyopt.families.serverless.formulations.model import build_problem
from energyopt.families.serverless.spec import ServerlessFile
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from tests.serverless_exhaustive import random_doc

SEED = 31
INSTANCES = 3
TOL = 1e-6
QUIET = lambda _msg: None  # noqa: E731
Doc = dict[str, Any]


def _doc(rng: random.Random) -> Doc:
    """A random small file: the exhaustive harness's tiny file with up to three
    nodes of two GPUs, four epochs and a second model."""
    doc = random_doc(rng)
    for node in doc["nodes"]:
        node["gpus"] = 2
    for i in range(len(doc["nodes"]), rng.choice([2, 3])):
        doc["nodes"].append({"name": f"n{i}", "gpus": 2})
    first = doc["models"][0]
    first["demand_rps"] = [round(rng.uniform(0.5, 12.0), 2) for _ in range(rng.choice([2, 4]))]
    if rng.random() < 0.6:
        second = copy.deepcopy(first)
        second["name"] = "code"
        second["model"] = "Llama-2-7B"
        second["slo"] = {"ttft_ms": 1500, "tbt_ms": 60, "percentile": 90}
        second["demand_rps"] = [round(rng.uniform(0.0, 6.0), 2) for _ in first["demand_rps"]]
        doc["models"].append(second)
    return doc


def _optimum(doc: Doc) -> float | None:
    """The exact solver's optimum (None: proven infeasible); its plan verifies."""
    fam = family("serverless")
    p = build_problem(ServerlessFile.model_validate(doc))
    res = fam.solve(p, "milp", time_limit_s=120, rel_gap=1e-9, progress=QUIET)
    if res.status == INFEASIBLE:
        return None
    assert res.status == OPTIMAL and res.plan is not None, res.log
    assert fam.verify(p, res.plan) == []
    assert res.objective is not None
    assert res.objective == pytest.approx(fam.cost(p, res.plan), rel=1e-9)
    return res.objective


def _more_gpus(d: Doc) -> None:
    for node in d["nodes"]:
        node["gpus"] *= 2


def _no_power_caps(d: Doc) -> None:
    for node in d["nodes"]:
        node.pop("power_cap_w", None)


def _faster_nics(d: Doc) -> None:
    for node in d["nodes"]:
        node["nic_gbps"] = 4 * node.get("nic_gbps", 50.0)


def _more_clocks(d: Doc) -> None:
    d["options"]["clocks_mhz"] = sorted({*d["options"]["clocks_mhz"], 1755, 1980})


def _more_shares(d: Doc) -> None:
    d["options"]["shares_pct"] = sorted({*d["options"]["shares_pct"], 100})


def _looser_ttft(d: Doc) -> None:
    for m in d["models"]:
        m["slo"]["ttft_ms"] *= 1.5


def _less_demand(d: Doc) -> None:
    for m in d["models"]:
        m["demand_rps"] = [0.7 * x for x in m["demand_rps"]]


def _quicker_cold_start(d: Doc) -> None:
    d["cold_start"] = {"bandwidth_gbps": 2 * d["cold_start"]["bandwidth_gbps"], "fixed_s": 0.0}


def _no_drain(d: Doc) -> None:
    for m in d["models"]:
        m["decode_drain_s"] = 0.0


def _one_more_node(d: Doc) -> None:
    d["nodes"].append({"name": "extra", "gpus": 2})


RELAXATIONS: dict[str, Callable[[Doc], None]] = {
    f.__name__.lstrip("_"): f
    for f in (
        _more_gpus,
        _no_power_caps,
        _faster_nics,
        _more_clocks,
        _more_shares,
        _looser_ttft,
        _less_demand,
        _quicker_cold_start,
        _no_drain,
        _one_more_node,
    )
}


def _reverse_nodes(d: Doc) -> None:
    d["nodes"].reverse()


def _reverse_models(d: Doc) -> None:
    d["models"].reverse()


def _reverse_options(d: Doc) -> None:
    for key in ("shares_pct", "tp", "clocks_mhz"):
        d["options"][key] = list(reversed(d["options"][key]))


REORDERINGS: dict[str, Callable[[Doc], None]] = {
    f.__name__.lstrip("_"): f for f in (_reverse_nodes, _reverse_models, _reverse_options)
}


def _cases() -> list[tuple[Doc, float]]:
    """Random files with a plan, and their optima."""
    rng = random.Random(SEED)
    out: list[tuple[Doc, float]] = []
    while len(out) < INSTANCES:
        doc = _doc(rng)
        try:
            value = _optimum(doc)
        except Exception as exc:  # an SLO no option meets: draw again
            if "no instance option serves" not in str(exc):
                raise
            continue
        if value is not None:
            out.append((doc, value))
    return out


@pytest.fixture(scope="module")
def cases() -> list[tuple[Doc, float]]:
    return _cases()


def test_the_instances_have_what_the_relaxations_change(cases: list[tuple[Doc, float]]) -> None:
    docs = [d for d, _ in cases]
    assert any(len(d["models"]) == 2 for d in docs)
    assert any(len(d["nodes"]) == 3 for d in docs)
    assert any("power_cap_w" in n or "nic_gbps" in n for d in docs for n in d["nodes"])


@pytest.mark.parametrize("name", sorted(RELAXATIONS))
def test_a_relaxation_never_raises_the_optimum(
    cases: list[tuple[Doc, float]], name: str
) -> None:
    for k, (doc, base) in enumerate(cases):
        relaxed = copy.deepcopy(doc)
        RELAXATIONS[name](relaxed)
        value = _optimum(relaxed)
        assert value is not None, f"instance {k}: {name} made it infeasible"
        assert value <= base * (1 + TOL) + TOL, f"instance {k}: {name}: {base} -> {value}"


@pytest.mark.parametrize("name", sorted(REORDERINGS))
def test_a_reordering_never_changes_the_optimum(
    cases: list[tuple[Doc, float]], name: str
) -> None:
    for k, (doc, base) in enumerate(cases):
        moved = copy.deepcopy(doc)
        REORDERINGS[name](moved)
        value = _optimum(moved)
        assert value == pytest.approx(base, rel=TOL, abs=TOL), f"instance {k}: {name}"
