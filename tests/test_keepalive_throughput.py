"""The keep-alive throughput objective: most requests starting within their
function's start-latency limit per second, then least energy; the milp solver
against brute force, its bound, the CLI round trip and the solvers that refuse it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main
from energyopt.families import certify, family
from energyopt.families.keepalive.formulations.model import build_problem
from energyopt.families.keepalive.solvers.milp import solve_milp
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import INFEASIBLE, OPTIMAL

from .test_keepalive import _plan, _random_instance, _small


def _throughput(doc: dict[str, Any]) -> dict[str, Any]:
    doc["objective"] = {**doc.get("objective", {}), "kind": "throughput"}
    return doc


def _brute_force(spec: KeepAliveFile) -> tuple[float, float] | None:
    """(most throughput, least energy at it) over every plan the verifier accepts."""
    n_t = spec.functions[0].n_windows
    choices = [(s, n.name) for s in ("warm", "tepid", "cold") for n in spec.nodes]
    paths = list(itertools.product(choices, repeat=n_t))
    best: tuple[float, float] | None = None
    for combo in itertools.product(paths, repeat=len(spec.functions)):
        plan = _plan(
            *(
                (fn.name, [c[0] for c in path], [c[1] for c in path])
                for fn, path in zip(spec.functions, combo, strict=True)
            )
        )
        ev = evaluate_keepalive(spec, plan)
        if ev.violations:
            continue
        key = (ev.throughput_rps, ev.energy_j)
        if (
            best is None
            or key[0] > best[0] + 1e-12
            or (abs(key[0] - best[0]) <= 1e-12 and key[1] < best[1])
        ):
            best = key
    return best


@pytest.mark.parametrize("seed", range(10))
def test_milp_against_brute_force(seed: int) -> None:
    spec = KeepAliveFile.model_validate(_throughput(_random_instance(seed)))
    p = build_problem(spec)
    best = _brute_force(spec)
    res = solve_milp(p, rel_gap=1e-9)
    if best is None:
        assert res.status == INFEASIBLE
        return
    assert res.status == OPTIMAL and res.plan is not None and res.sense == "max"
    ev = evaluate_keepalive(spec, res.plan)
    assert ev.violations == []
    assert res.objective == pytest.approx(best[0], rel=1e-9)
    assert res.objective == pytest.approx(ev.throughput_rps, rel=1e-9)
    assert ev.energy_j == pytest.approx(best[1], rel=1e-6)  # least energy at the most throughput
    assert res.bound is not None and res.bound >= best[0] * (1 - 1e-9)
    notes: list[str] = []
    certify(family("keepalive"), p, res, 1e-6, notes.append)
    assert notes == [] and res.status == OPTIMAL


def test_throughput_trades_a_missed_slo_for_the_most_requests_in_time() -> None:
    # two functions, 70 + 40 GB warm on one 80 GB GPU, cold starts over the 10 s limit,
    # no tepid: the energy objective's p90 SLO cannot hold for both (infeasible), the
    # throughput objective keeps the busier one warm
    doc = _small()
    doc["functions"][1] = {**doc["functions"][1], "arrivals": [9, 9, 9]}
    doc["functions"][1]["cold_start"] = {"time_s": 20, "energy_j": 800}
    doc["functions"][1]["warm"]["gpu_memory_gb"] = 40
    for fn in doc["functions"]:
        fn.pop("tepid", None)
    energy = build_problem(KeepAliveFile.model_validate(doc))
    assert solve_milp(energy).status == INFEASIBLE
    p = build_problem(KeepAliveFile.model_validate(_throughput(doc)))
    res = solve_milp(p)
    assert res.status == OPTIMAL and res.plan is not None
    small = res.plan.functions[1]
    assert small.states == ("warm", "warm", "warm")
    assert res.objective == pytest.approx(27 / 180)  # the 27 requests in time over 180 s


def test_throughput_plans_round_trip_through_the_cli(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(yaml.safe_dump(_throughput(_small())))
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "-q", "-o", str(plan)]) == EXIT_OK
    out = capfd.readouterr().out
    assert "requests/s" in out
    data = json.loads(plan.read_text())
    assert data["objective_unit"] == "requests/s" and data["bound"] >= data["objective"] - 1e-9
    assert main(["verify", str(path), str(plan)]) == EXIT_OK
    data["bound"] = data["objective"] * 0.5  # an upper bound below the plan's own throughput
    plan.write_text(json.dumps(data))
    assert main(["verify", str(path), str(plan)]) != EXIT_OK
    capfd.readouterr()
    for solver in ("lagrangian", "rolling"):
        assert main(["solve", str(path), "--solver", solver, "-q"]) == EXIT_BAD_INPUT
        err = capfd.readouterr().err
        assert "throughput objective" in err and "Traceback" not in err
