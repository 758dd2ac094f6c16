"""Keep-alive family (``kind: keepalive``): every solver against brute force on tiny
instances, the verifier's rejections, bad input named by file and field, and every
CLI verb on the bundled instance."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from energyopt.families import certify, family
from energyopt.families.keepalive.formulations.model import build_problem, load_keepalive
from energyopt.families.keepalive.solvers.lagrangian import solve_lagrangian
from energyopt.families.keepalive.solvers.milp import solve_milp, solve_rolling
from energyopt.families.keepalive.spec import FunctionSchedule, KeepAliveFile, KeepAlivePlan
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from energyopt.spec.errors import SpecError

from .cli_helpers import read_exported

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "instances" / "keepalive" / "azure-llm-2nodes.yaml"


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def _function(name: str, warm_gb: float, arrivals: list[int], tepid: bool = True) -> dict[str, Any]:
    fn: dict[str, Any] = {
        "name": name,
        "warm": {"gpu_memory_gb": warm_gb, "host_memory_gb": 2, "power_w": warm_gb},
        "cold_start": {"time_s": 20, "energy_j": 3000},
        "service": {"time_s": 1, "power_w": 300},
        "arrivals": arrivals,
    }
    if tepid:
        fn["tepid"] = {
            "gpu_memory_gb": 0.5,
            "host_memory_gb": warm_gb,
            "power_w": 5,
            "enter_s": 2,
            "enter_j": 300,
            "resume_s": 8,
            "resume_j": 1200,
        }
    return fn


def _small(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "keepalive",
        "name": "small",
        "window_s": 60,
        "slo": {"start_latency_s": 10, "percentile": 90},
        "nodes": [
            {"name": "a", "gpu_memory_gb": 80, "host_memory_gb": 256, "power_budget_w": 2000}
        ],
        "functions": [_function("big", 70, [3, 0, 4]), _function("small", 20, [5, 1, 0], False)],
    }
    doc["functions"][1]["cold_start"] = {"time_s": 5, "energy_j": 800}
    doc.update(changes)
    return doc


def _plan(*rows: tuple[str, list[str], list[str]]) -> KeepAlivePlan:
    return KeepAlivePlan(
        functions=tuple(
            FunctionSchedule(function=f, states=tuple(s), nodes=tuple(n))  # type: ignore[arg-type]
            for f, s, n in rows
        )
    )


def _random_instance(seed: int) -> dict[str, Any]:
    """A tiny instance whose budgets, SLOs, cap and window length bind by chance."""
    rng = random.Random(seed)
    n_nodes = rng.choice([1, 2])
    n_windows = 3 if n_nodes == 1 else 2
    functions = []
    for i in range(2):
        warm_gb = rng.choice([20.0, 45.0, 70.0])
        fn = _function(f"f{i}", warm_gb, [rng.randint(0, 6) for _ in range(n_windows)])
        fn["cold_start"] = {
            "time_s": rng.choice([5.0, 12.0, 25.0, 45.0]),
            "energy_j": rng.uniform(500, 4000),
        }
        fn["warm"]["power_w"] = rng.uniform(10, 90)
        fn["service"] = {"time_s": rng.uniform(0.5, 3), "power_w": rng.uniform(100, 400)}
        if rng.random() < 0.3:
            del fn["tepid"]
        else:
            fn["tepid"]["resume_s"] = rng.choice([3.0, 12.0])
            fn["tepid"]["resume_j"] = rng.uniform(50, 600)
            fn["tepid"]["enter_j"] = rng.uniform(20, 200)
            fn["tepid"]["power_w"] = rng.uniform(1, 15)
        if rng.random() < 0.3:
            fn["slo"] = {"start_latency_s": rng.choice([4.0, 15.0]), "percentile": 70}
        functions.append(fn)
    nodes = [
        {
            "name": f"n{k}",
            "gpu_memory_gb": rng.choice([80.0, 100.0]),
            "host_memory_gb": rng.choice([60.0, 200.0]),
            "power_budget_w": rng.uniform(300, 1500),
        }
        for k in range(n_nodes)
    ]
    doc: dict[str, Any] = {
        "kind": "keepalive",
        "name": f"random-{seed}",
        "window_s": 30.0,
        "nodes": nodes,
        "functions": functions,
        "slo": {"start_latency_s": 10.0, "percentile": rng.choice([50.0, 80.0])},
    }
    if rng.random() < 0.4:
        doc["objective"] = {"max_cold_start_rate": rng.choice([0.0, 0.3])}
    return doc


def _brute_force(spec: KeepAliveFile) -> float | None:
    """The least energy over every plan the verifier accepts (None: no plan)."""
    n_t = spec.functions[0].n_windows
    choices = [(s, n.name) for s in ("warm", "tepid", "cold") for n in spec.nodes]
    paths = list(itertools.product(choices, repeat=n_t))
    best: float | None = None
    for combo in itertools.product(paths, repeat=len(spec.functions)):
        plan = _plan(
            *(
                (fn.name, [c[0] for c in path], [c[1] for c in path])
                for fn, path in zip(spec.functions, combo, strict=True)
            )
        )
        ev = evaluate_keepalive(spec, plan)
        if not ev.violations and (best is None or ev.energy_j < best):
            best = ev.energy_j
    return best


@pytest.mark.parametrize("seed", range(12))
def test_every_solver_against_brute_force(seed: int) -> None:
    spec = KeepAliveFile.model_validate(_random_instance(seed))
    p = build_problem(spec)
    optimum = _brute_force(spec)
    exact = solve_milp(p, rel_gap=1e-9)
    if optimum is None:
        assert exact.status == INFEASIBLE
        assert solve_lagrangian(p, max_iterations=30).plan is None
        return
    assert exact.status == OPTIMAL and exact.plan is not None
    assert exact.objective == pytest.approx(optimum, rel=1e-9)
    assert evaluate_keepalive(spec, exact.plan).energy_j == pytest.approx(optimum, rel=1e-9)
    lag = solve_lagrangian(p, max_iterations=60)
    assert lag.bound is not None and lag.bound <= optimum * (1 + 1e-9) + 1e-6
    if lag.plan is not None:
        ev = evaluate_keepalive(spec, lag.plan)
        assert ev.violations == []
        assert lag.objective == pytest.approx(ev.energy_j, rel=1e-9)
        assert ev.energy_j >= optimum * (1 - 1e-9)
    rolled = solve_rolling(p, lookahead=1, step=1)
    if rolled.plan is not None:
        ev = evaluate_keepalive(spec, rolled.plan)
        assert ev.violations == [] and ev.energy_j >= optimum * (1 - 1e-9)
        assert rolled.objective == pytest.approx(ev.energy_j, rel=1e-9)


def test_brute_force_instances_exercise_every_constraint() -> None:
    """The seeds above include infeasible instances and plans that use every state."""
    outcomes = set()
    used = set()
    for seed in range(8):
        p = build_problem(KeepAliveFile.model_validate(_random_instance(seed)))
        res = solve_milp(p)
        outcomes.add(res.status)
        if res.plan is not None:
            used |= {s for f in res.plan.functions for s in f.states}
    assert INFEASIBLE in outcomes and OPTIMAL in outcomes
    assert used == {"warm", "tepid", "cold"}


def test_the_verifier_rejects_memory_over_commit() -> None:
    spec = KeepAliveFile.model_validate(_small())
    plan = _plan(("big", ["warm"] * 3, ["a"] * 3), ("small", ["warm"] * 3, ["a"] * 3))
    kinds = {(v.kind, v.where) for v in evaluate_keepalive(spec, plan).violations}
    assert ("gpu_memory", "a window 0") in kinds
    ok = _plan(("big", ["warm"] * 3, ["a"] * 3), ("small", ["cold"] * 3, ["a"] * 3))
    assert evaluate_keepalive(spec, ok).violations == []


def test_the_verifier_rejects_impossible_transitions_and_states() -> None:
    spec = KeepAliveFile.model_validate(_small(window_s=10))  # a cold start takes 20 s
    plan = _plan(("big", ["cold", "warm", "warm"], ["a"] * 3), ("small", ["cold"] * 3, ["a"] * 3))
    bad = evaluate_keepalive(spec, plan).violations
    assert [(v.kind, v.where) for v in bad if v.kind == "transition"] == [
        ("transition", "big window 1")
    ]
    tepid = _plan(("big", ["cold"] * 3, ["a"] * 3), ("small", ["tepid"] * 3, ["a"] * 3))
    assert any(v.kind == "state" for v in evaluate_keepalive(spec, tepid).violations)
    nowhere = _plan(("big", ["cold"] * 3, ["x"] * 3), ("small", ["cold"] * 3, ["a"] * 3))
    assert any(v.kind == "node" for v in evaluate_keepalive(spec, nowhere).violations)


def test_the_verifier_rejects_late_starts_power_and_cold_cap() -> None:
    spec = KeepAliveFile.model_validate(
        _small(objective={"max_cold_start_rate": 0.1}, nodes=[_node(power=100)])
    )
    plan = _plan(("big", ["cold"] * 3, ["a"] * 3), ("small", ["warm"] * 3, ["a"] * 3))
    kinds = {v.kind for v in evaluate_keepalive(spec, plan).violations}
    assert kinds == {"slo", "cold_starts", "power"}


def _node(power: float = 2000, gpu: float = 80) -> dict[str, Any]:
    return {"name": "a", "gpu_memory_gb": gpu, "host_memory_gb": 256, "power_budget_w": power}


def test_the_solvers_respect_the_budgets_they_are_given() -> None:
    """Memory for one warm function only: the exact plan keeps the other tepid or cold."""
    p = build_problem(KeepAliveFile.model_validate(_small()))
    res = solve_milp(p)
    assert res.plan is not None
    big, small = res.plan.functions
    for t in range(3):
        assert not (big.states[t] == "warm" and small.states[t] == "warm")
    lag = solve_lagrangian(p)
    assert lag.plan is not None and lag.bound is not None
    assert lag.bound <= res.objective + 1e-6 <= lag.objective + 2e-6  # type: ignore[operator]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"window_s": -1}, "window_s"),
        ({"functions": [_function("f", 10, [1, -2])]}, "functions[0](f)"),
        ({"functions": [_function("f", 10, [1]), _function("g", 10, [1, 2])]}, "(top level)"),
        ({"nodes": [_node(), _node()]}, "(top level)"),
        ({"slo": {"start_latency_s": 5, "percentile": 120}}, "slo.percentile"),
    ],
)
def test_bad_input_names_file_and_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_small(**change)))
    with pytest.raises(SpecError) as info:
        load_keepalive(path)
    assert f"{path}: {field}" in str(info.value)


def test_an_unknown_node_of_a_function_is_named(tmp_path: Path) -> None:
    fn = _function("f", 10, [1, 2, 3])
    fn["nodes"] = ["z"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_small(functions=[fn])))
    with pytest.raises(SpecError, match=r"bad.yaml: functions\[0\]\(f\).nodes: unknown node 'z'"):
        load_keepalive(path)


def test_every_cli_verb_on_the_bundled_instance(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = str(BUNDLED)
    code, out, _ = run(capfd, "validate", path)
    assert code == EXIT_OK and "4 functions, 2 nodes, 12 windows" in out
    code, out, _ = run(capfd, "show", path)
    assert code == EXIT_OK and "qwen3-32b" in out
    plan = tmp_path / "plan.json"
    code, out, err = run(capfd, "solve", path, "--solver", "milp", "-q", "-o", str(plan))
    assert code == EXIT_OK, err
    assert "status optimal" in out
    data = json.loads(plan.read_text())
    code, out, err = run(capfd, "verify", path, str(plan))
    assert code == EXIT_OK and "feasible" in out, err
    bad = dict(data, objective=data["objective"] * 1.5)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run(capfd, "verify", path, str(tmp_path / "bad.json"))
    assert code == EXIT_VIOLATION and "[objective]" in err
    crowded = dict(data)
    crowded["functions"] = [
        dict(f, states=["warm"] * 12, nodes=["h100-a"] * 12) for f in data["functions"]
    ]
    (tmp_path / "crowded.json").write_text(json.dumps(crowded))
    code, _, err = run(capfd, "verify", path, str(tmp_path / "crowded.json"))
    assert code == EXIT_VIOLATION and "[gpu_memory] h100-a window 0" in err
    export = tmp_path / "keepalive.mps"
    code, _, err = run(capfd, "export", path, "-o", str(export))
    assert code == EXIT_OK, err
    h = read_exported(export)
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(data["objective"], rel=1e-6)
    code, out, _ = run(capfd, "schema", "keepalive")
    assert code == EXIT_OK and json.loads(out)["type"] == "object"


def test_bad_plan_file_is_named(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"functions": [{"function": "qwen3-32b", "states": ["hot"]}]}))
    code, _, err = run(capfd, "verify", str(BUNDLED), str(plan))
    assert code == EXIT_BAD_INPUT and f"{plan}: functions[0]" in err


def test_every_solver_returns_a_certified_result_on_the_bundled_instance() -> None:
    fam = family("keepalive")
    p = fam.load(str(BUNDLED), [])
    results = {}
    for entry in fam.solvers():
        if entry.name == "auto":
            continue  # the milp below, by its column count
        res = fam.solve(p, entry.name, time_limit_s=30, rel_gap=1e-6, progress=lambda _: None)
        certify(fam, p, res, 1e-6, lambda _: None)
        assert res.plan is not None, (entry.name, res.log)
        assert fam.verify(p, res.plan) == []
        assert res.objective == pytest.approx(fam.cost(p, res.plan), rel=1e-9)
        if entry.guarantee != "heuristic":
            assert res.bound is not None
        results[entry.name] = res
    optimum = results["milp"].objective
    assert results["milp"].status == OPTIMAL and optimum is not None
    for res in results.values():
        assert res.objective is not None and res.objective >= optimum * (1 - 1e-6)
        assert res.bound is None or res.bound <= optimum * (1 + 1e-6)


def test_mutated_keepalive_files_are_refused_cleanly_or_solved(tmp_path: Path) -> None:
    """Deleted keys, wrong types, non-finite, extreme and repeated values anywhere in
    a keep-alive file: validate refuses them naming the file, or every solver
    returns a result whose plan (if any) the verifier accepts."""
    from .mutations import check_family_file_mutations

    original = _small(objective={"max_cold_start_rate": 0.5})
    check_family_file_mutations(
        tmp_path, original, ("milp", "lagrangian", "rolling"), max_examples=25
    )


def test_the_lagrangian_finds_a_plan_where_no_greedy_order_does() -> None:
    """The bundled two-node instance with three of its per-window counts changed
    (qwen3-32b 5 -> 15 in window 10, deepseek 44 -> 132 in window 9, opt-6.7b 29 -> 14
    in window 7): the MILP's optimum moves functions between nodes and states in turn,
    and the greedy repair finds no plan in any of the 24 orders. The path master
    (column generation over the functions' paths, then a 0/1 choice) finds one that
    verifies, no cheaper than the optimum and within 2 % of it."""
    from energyopt.families.keepalive.solvers.lagrangian import Prices, _place

    data = yaml.safe_load((ROOT / "instances/keepalive/azure-llm-2nodes.yaml").read_text())
    for f, t, count in ((0, 10, 15), (1, 9, 132), (3, 7, 14)):
        data["functions"][f]["arrivals"][t] = count
    spec = KeepAliveFile.model_validate(data)
    p = build_problem(spec)
    orders = itertools.permutations(range(p.n_functions))
    assert all(_place(p, Prices.zero(p), 0.0, list(o))[0] is None for o in orders)
    exact = solve_milp(p)
    assert exact.status == OPTIMAL and exact.objective is not None
    # Its iteration limit, not the clock, ends the subgradient: on a loaded machine
    # the default 60 s can pass before the path master runs.
    lag = solve_lagrangian(p, time_limit_s=900)
    assert lag.plan is not None and lag.objective is not None, lag.log
    assert evaluate_keepalive(spec, lag.plan).violations == []
    assert exact.objective * (1 - 1e-9) <= lag.objective <= 1.02 * exact.objective


def test_the_lagrangian_falls_back_on_the_rolling_milp_when_the_path_master_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same tight instance, with the repair (which finds a plan there at the LP's
    prices), the path master and its dive finding nothing: the rolling-horizon
    MILP's plan is taken (its states read back from its plan file), it verifies,
    and the bound is still the Lagrangian's."""
    from energyopt.families.keepalive.solvers import lagrangian as kl

    data = yaml.safe_load((ROOT / "instances/keepalive/azure-llm-2nodes.yaml").read_text())
    for f, t, count in ((0, 10, 15), (1, 9, 132), (3, 7, 14)):
        data["functions"][f]["arrivals"][t] = count
    spec = KeepAliveFile.model_validate(data)
    p = build_problem(spec)
    monkeypatch.setattr(kl, "best_repair", lambda *a, **k: None)
    monkeypatch.setattr(kl, "solve_path_master", lambda *a, **k: None)
    monkeypatch.setattr(kl, "dive", lambda *a, **k: None)
    lag = kl.solve_lagrangian(p)
    assert lag.plan is not None and lag.objective is not None, lag.log
    assert any(line.startswith("rolling-horizon MILP: ") for line in lag.log), lag.log
    ev = evaluate_keepalive(spec, lag.plan)
    assert ev.violations == [] and ev.energy_j == pytest.approx(lag.objective, rel=1e-9)
    assert np.array_equal(p.states_of(p.plan_of(p.states_of(lag.plan))), p.states_of(lag.plan))
    assert lag.bound is not None and lag.bound <= lag.objective
