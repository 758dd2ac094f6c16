"""MoE edge serving (``kind: moe-edge``): every solver against brute force on tiny
models (bound <= optimum <= plan), the verifier's rejections, bad input named by
file and field, the token-level simulator's conservation of tokens, and every CLI
verb on a small file and a bundled instance."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import highspy
import numpy as np
import pytest
import yaml

from energyopt.catalog.loader import builtin_catalog
from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from energyopt.families import certify, family
from energyopt.families.moe_edge.formulations.figures import figures
from energyopt.families.moe_edge.formulations.model import (
    MoeEdgeProblem,
    build_problem,
    load_moe_edge,
)
from energyopt.families.moe_edge.sim import POLICIES, ExpertCache, sample_routing, simulate
from energyopt.families.moe_edge.solvers.lagrangian import solve_lagrangian
from energyopt.families.moe_edge.solvers.milp import solve_milp
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan
from energyopt.families.moe_edge.verify import evaluate_moe_edge
from energyopt.solvers.result import OPTIMAL
from energyopt.spec.errors import SpecError
from energyopt.spec.llm import LlmModel

from .cli_helpers import read_exported

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "instances" / "moe-edge" / "olmoe-l4-github.yaml"

TINY: dict[str, Any] = {
    "name": "Tiny-MoE",
    "layers": 2,
    "hidden_size": 256,
    "heads": 4,
    "kv_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "params_total_b": 0.004,
    "params_active_b": 0.003,
    "experts": 3,
    "experts_per_token": 1,
    "max_context": 4096,
    "sources": {"layers": "test model"},
}
CATALOG = builtin_catalog().merged([], [LlmModel.model_validate(TINY)])
EXPERT_GB = 3 * 256 * 512 * 2 / 1e9
DENSE_GB = (0.004e9 - 2 * 3 * 3 * 256 * 512) * 2 / 1e9 + 512 * 2 * 2 * 4 * 64 * 2 / 1e9


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def _doc(seed: int, gpus: int = 1, objective: str = "energy", **changes: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    freq = [rng.dirichlet(np.full(3, 0.7)).round(4).tolist() for _ in range(2)]
    gpu_list: list[dict[str, Any]] = [
        {
            "name": f"g{i}",
            "type": "L4",
            "memory_gb": DENSE_GB + 2.2 * EXPERT_GB if i == 0 else 2.3 * EXPERT_GB,
            "pcie_gbps": float(rng.uniform(1.0, 4.0)),
            "clocks_mhz": [915, 2040] if i == 0 else [2040],
        }
        for i in range(gpus)
    ]
    doc: dict[str, Any] = {
        "kind": "moe-edge",
        "name": f"tiny-{seed}",
        "model": "Tiny-MoE",
        "server": {
            "name": "box",
            "gpus": gpu_list,
            "host_memory_gb": 1.0,
            "cpu": {
                "expert_gflops": 100.0,
                "memory_bandwidth_gbps": float(rng.uniform(1.0, 8.0)),
                "idle_w": 30.0,
                "active_w": 120.0,
            },
            "hop_ms": float(rng.uniform(0.01, 0.2)),
        },
        "reserve_gb": 0.0,
        "activations": {
            "source": "test",
            "layers": [{"layer": i, "frequencies": f} for i, f in enumerate(freq)],
        },
        "slo": {"tbt_ms": 2.4, "percentile": 90.0},
        "objective": {"kind": objective},
    }
    if objective == "latency":
        doc["objective"]["power_cap_w"] = float(rng.uniform(60, 90))
    if gpus > 1:
        doc["activations"]["co_activation"] = [{"a": [0, 0], "b": [0, 1], "probability": 0.3}]
    doc.update(changes)
    return doc


def _problem(doc: dict[str, Any]) -> MoeEdgeProblem:
    return build_problem(MoeEdgeFile.model_validate(doc), "<test>", CATALOG)


def _brute(p: MoeEdgeProblem) -> float:
    best = np.inf
    for config in p.configs():
        c = p.costs(config)
        if c.gpu_free_gb[config.dense] < 0:
            continue  # the dense part does not fit: no plan of this configuration
        for combo in itertools.product(range(p.n_options), repeat=p.n_items):
            f = figures(p, c, np.array(combo))
            if f.feasible:
                best = min(best, f.objective)
    return best


CASES = [(s, 1, "energy") for s in range(4)] + [(s, 2, "energy") for s in range(4, 6)]
CASES += [(6, 1, "latency"), (7, 2, "latency")]


@pytest.mark.parametrize(("seed", "gpus", "objective"), CASES)
def test_every_solver_against_brute_force(seed: int, gpus: int, objective: str) -> None:
    p = _problem(_doc(seed, gpus, objective))
    optimum = _brute(p)
    milp = solve_milp(p, rel_gap=1e-9)
    lag = solve_lagrangian(p, rel_gap=1e-9)
    if not np.isfinite(optimum):
        assert milp.plan is None and lag.plan is None
        return
    for res in (milp, lag):
        assert res.plan is not None, res.log
        ev = evaluate_moe_edge(p.spec, CATALOG, res.plan)
        assert ev.violations == []
        assert res.objective == pytest.approx(ev.cost, rel=1e-9)
        assert res.bound is not None
        assert res.bound <= optimum * (1 + 1e-9) + 1e-12
        assert res.objective >= optimum * (1 - 1e-9) - 1e-12
    assert milp.objective is not None and milp.objective <= optimum * (1 + 1e-6)


def test_the_verifier_agrees_with_the_planner_on_random_plans() -> None:
    p = _problem(_doc(11, 2))
    rng = np.random.default_rng(0)
    for _ in range(30):
        config = p.configs()[int(rng.integers(len(p.configs())))]
        choice = rng.integers(0, p.n_options, p.n_items)
        c = p.costs(config)
        f = figures(p, c, choice)
        ev = evaluate_moe_edge(p.spec, CATALOG, p.plan_of(config, choice))
        assert ev.cost == pytest.approx(f.objective, rel=1e-9)
        assert ev.tbt_bound_ms == pytest.approx(f.tbt_at_percentile_ms, rel=1e-9)
        assert (ev.violations == []) == f.feasible


def _plan(p: MoeEdgeProblem, places: list[list[str]]) -> MoeEdgePlan:
    placement = tuple(tuple(row) for row in places)
    return MoeEdgePlan(dense_gpu="g0", clocks_mhz={"g0": 2040}, placement=placement)


def test_the_verifier_rejects_overfull_memory_and_slo_breaches() -> None:
    p = _problem(_doc(1, slo={"tbt_ms": 100.0, "percentile": 90.0}))
    ok = evaluate_moe_edge(p.spec, CATALOG, _plan(p, [["g0", "g0", "cpu"], ["fetch"] * 3]))
    assert ok.violations == []
    full = evaluate_moe_edge(p.spec, CATALOG, _plan(p, [["g0"] * 3, ["g0", "cpu", "cpu"]]))
    assert [v.kind for v in full.violations] == ["memory"]
    assert "g0" in str(full.violations[0])
    slow = _problem(_doc(1, slo={"tbt_ms": 1.0, "percentile": 90.0}))
    late = evaluate_moe_edge(slow.spec, CATALOG, _plan(slow, [["cpu"] * 3, ["cpu"] * 3]))
    assert [v.kind for v in late.violations] == ["slo"]
    assert "TBT at p90" in str(late.violations[0])
    shape = evaluate_moe_edge(p.spec, CATALOG, _plan(p, [["g0", "nowhere", "cpu"], ["cpu"] * 3]))
    assert "unknown place 'nowhere'" in str(shape.violations[0])
    clocks = MoeEdgePlan(
        dense_gpu="g0", clocks_mhz={"g0": 2041}, placement=(("cpu",) * 3, ("cpu",) * 3)
    )
    assert evaluate_moe_edge(p.spec, CATALOG, clocks).violations[0].kind == "clock"


def test_a_tighter_percentile_needs_a_faster_plan() -> None:
    loose = _problem(_doc(3, slo={"tbt_ms": 2.6, "percentile": 50.0}))
    tight = _problem(_doc(3, slo={"tbt_ms": 2.6, "percentile": 99.0}))
    a, b = solve_milp(loose), solve_milp(tight)
    if a.objective is not None and b.objective is not None:
        assert b.objective >= a.objective - 1e-12


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "No-Such-MoE"}, "model: unknown model"),
        ({"model": "Llama-3.1-8B"}, "model: Llama-3.1-8B is dense"),
        ({"batch": 0}, "batch"),
        ({"cache_experts": -1}, "cache_experts"),
        ({"slo": {"tbt_ms": 5, "percentile": 100}}, "slo.percentile"),
        ({"objective": {"kind": "latency"}}, "objective"),
    ],
)
def test_bad_input_names_file_and_field(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], change: dict[str, Any], field: str
) -> None:
    catalog = tmp_path / "tiny.yaml"
    catalog.write_text(yaml.safe_dump({"models": [TINY]}))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_doc(0, **change)))
    code, _, err = run(capfd, "validate", str(path), "--catalog", str(catalog))
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"{path}: {field}"), err
    assert "Traceback" not in err


def test_bad_bindings_name_the_field(tmp_path: Path) -> None:
    doc = _doc(0)
    doc["activations"]["layers"][1]["frequencies"] = [0.5, 0.2, 0.1]
    doc["server"]["gpus"][0]["type"] = "Q9000"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    catalog = tmp_path / "tiny.yaml"
    catalog.write_text(yaml.safe_dump({"models": [TINY]}))
    with pytest.raises(SpecError) as info:
        load_moe_edge(path, [catalog])
    text = str(info.value)
    assert f"{path}: server.gpus[0](g0).type: unknown GPU type" in text
    assert f"{path}: activations.layers[1].frequencies: shares sum to 0.8" in text
    doc = _doc(0)
    doc["server"]["gpus"][0]["name"] = "cpu"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=r"bad.yaml: server.gpus: Value error, 'cpu' is reserved"):
        load_moe_edge(path, [catalog])


def test_the_simulator_conserves_tokens_and_matches_the_plan_in_expectation() -> None:
    p = load_moe_edge(BUNDLED)
    res = solve_milp(p)
    assert res.plan is not None
    routing = sample_routing(p.freq, p.model.experts_per_token, 200, seed=3)
    assert all(len(set(routing[t, la].tolist())) == 8 for t in range(5) for la in range(16))
    offload = p.plan_of(p.max_clock_config(), np.full(p.n_items, p.fetch))
    for plan in (res.plan, offload):
        for policy in POLICIES:
            sim = simulate(p, plan, routing, policy, cache_slots=64)
            assert sim.tokens == 200 and sim.steps == 200
            assert sim.routed == 200 * 16 * 8
            assert sim.on_gpu + sim.cached + sim.fetched + sim.on_cpu == sim.routed
            assert sim.pcie_bytes == pytest.approx(sim.fetched * p.expert_gb * 1e9)
    ev = evaluate_moe_edge(p.spec, builtin_catalog(), res.plan)
    sim = simulate(p, res.plan, routing, "sparsity")
    assert sim.energy_per_token_j == pytest.approx(ev.energy_per_token_j, rel=0.05)


def test_the_caches_evict_by_their_rule() -> None:
    share = np.array([0.5, 0.1, 0.3, 0.2])
    for policy, kept in (("lru", {2, 3}), ("lfu", {0, 3}), ("sparsity", {0, 2})):
        cache = ExpertCache(2, policy, share)  # type: ignore[arg-type]
        for item in (0, 0, 1, 2, 3):
            if not cache.lookup(item):
                cache.admit(item)
        assert set(cache.held) == kept, policy


def test_every_cli_verb(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "tiny.yaml"
    catalog.write_text(yaml.safe_dump({"models": [TINY]}))
    path = tmp_path / "tiny.yaml.d"
    path.mkdir()
    inst = path / "inst.yaml"
    inst.write_text(yaml.safe_dump(_doc(2, 2, slo={"tbt_ms": 3.0, "percentile": 90.0})))
    cat = ["--catalog", str(catalog)]
    code, out, err = run(capfd, "validate", str(inst), *cat)
    assert code == EXIT_OK and "Tiny-MoE (2 layers x 3 experts" in out, err
    code, out, _ = run(capfd, "show", str(inst), *cat)
    assert code == EXIT_OK and "g1" in out
    plan = tmp_path / "plan.json"
    solve = ("solve", str(inst), "--solver", "milp", "-q", "-o", str(plan))
    code, out, err = run(capfd, *solve, *cat)
    assert code == EXIT_OK and "status optimal" in out, err
    data = json.loads(plan.read_text())
    code, out, err = run(capfd, "verify", str(inst), str(plan), *cat)
    assert code == EXIT_OK and "feasible" in out, err
    (tmp_path / "bad.json").write_text(json.dumps(dict(data, objective=data["objective"] * 2)))
    code, _, err = run(capfd, "verify", str(inst), str(tmp_path / "bad.json"), *cat)
    assert code == EXIT_VIOLATION and "[objective]" in err
    crowded = dict(data, placement=[["g1"] * 3, ["g1"] * 3])
    (tmp_path / "crowded.json").write_text(json.dumps(crowded))
    code, _, err = run(capfd, "verify", str(inst), str(tmp_path / "crowded.json"), *cat)
    assert code == EXIT_VIOLATION and "[memory] g1" in err
    export = tmp_path / "moe.mps"
    code, _, err = run(capfd, "export", str(inst), "-o", str(export), *cat)
    assert code == EXIT_OK, err
    h = read_exported(export)
    h.run()
    ok = (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible)
    assert h.getModelStatus() in ok
    code, out, _ = run(capfd, "schema", "moe-edge")
    assert code == EXIT_OK and json.loads(out)["type"] == "object"


def test_every_solver_is_certified_on_a_bundled_instance() -> None:
    fam = family("moe-edge")
    p = fam.load(str(BUNDLED), [])
    results = {}
    for entry in fam.solvers():
        res = fam.solve(p, entry.name, time_limit_s=60, rel_gap=1e-6, progress=lambda _: None)
        certify(fam, p, res, 1e-6, lambda _: None)
        assert res.plan is not None and fam.verify(p, res.plan) == []
        assert res.bound is not None
        results[entry.name] = res
    assert results["milp"].status == OPTIMAL
    optimum = results["milp"].objective
    assert optimum is not None
    for res in results.values():
        assert res.objective is not None and res.objective >= optimum * (1 - 1e-6)
        assert res.bound is not None and res.bound <= optimum * (1 + 1e-6)
    lag = results["lagrangian"].objective
    assert lag is not None and lag <= optimum * 1.02


def test_a_server_too_small_for_the_dense_part_is_diagnosed() -> None:
    doc = _doc(0)
    doc["server"]["gpus"][0]["memory_gb"] = DENSE_GB / 2
    res = solve_milp(_problem(doc))
    assert res.plan is None and res.status == "infeasible"
    assert "no GPU holds the dense part" in res.diagnosis[0]


def test_mutated_moe_edge_files_are_refused_cleanly_or_solved(tmp_path: Path) -> None:
    """Deleted keys, wrong types, non-finite, extreme and repeated values anywhere in
    a moe-edge file: validate refuses them naming the file, or both solvers return a
    result whose plan (if any) the verifier accepts."""
    from .mutations import check_family_file_mutations

    catalog = tmp_path / "tiny.yaml"
    catalog.write_text(yaml.safe_dump({"models": [TINY]}))
    check_family_file_mutations(
        tmp_path,
        _doc(2, 2),
        ("milp", "lagrangian"),
        extra_args=("--catalog", str(catalog)),
        max_examples=20,
    )


def test_the_mix_table_returns_the_plan_solved_for_the_observed_mix(tmp_path: Path) -> None:
    from energyopt.families.moe_edge.tables import MixTable, compile_mix_table, mixed_problem
    from energyopt.tables.stdlib_reader import StdlibTable

    base = _problem(_doc(5, 2, slo={"tbt_ms": 3.0, "percentile": 90.0}))
    fa = base.freq
    fb = _problem(_doc(9, 2)).freq
    path = tmp_path / "mix.eot"
    objectives = compile_mix_table(base, fa, fb, path, cells=5, solver="milp")
    table = MixTable.open(path)
    assert table.mixes == (0.0, 0.25, 0.5, 0.75, 1.0)
    for k, a in enumerate(table.mixes):
        p = mixed_problem(base, fa, fb, a)
        direct = solve_milp(p, rel_gap=1e-4)
        plan = table.plan_at(k)
        assert (plan is None) == (direct.plan is None) == (objectives[k] is None)
        if plan is None or direct.objective is None:
            continue
        ev = evaluate_moe_edge(p.spec, CATALOG, plan)
        assert ev.violations == []
        assert ev.cost == pytest.approx(objectives[k], rel=1e-9)
        assert ev.cost == pytest.approx(direct.objective, rel=1e-3)
    observed = 0.3 * fa + 0.7 * fb
    a, plan = table.plan(observed * 1000)  # counts, not shares
    assert a == pytest.approx(0.3, abs=1e-9) and table.cell(a) == 1
    assert table.estimate(fa * 5) == pytest.approx(1.0) and table.estimate(2 * fb - fa) == 0.0
    row = StdlibTable(str(path)).lookup(mix=0.25, item=3)
    assert row["in_grid"] and row["place"] == table.table.array("place")[1][3]


def test_more_activation_layers_than_the_model_has_are_refused_naming_the_field(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    catalog = tmp_path / "tiny.yaml"
    catalog.write_text(yaml.safe_dump({"models": [TINY]}))
    doc = _doc(0)
    first = doc["activations"]["layers"][0]["frequencies"]
    doc["activations"]["layers"] = [{"layer": j, "frequencies": first} for j in range(512)]
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(doc))
    code, _, err = run(capfd, "validate", str(path), "--catalog", str(catalog))
    assert code == EXIT_BAD_INPUT and "Traceback" not in err and "internal error" not in err
    assert err.startswith(f"{path}: activations.layers: 512 layers given; Tiny-MoE has 2"), err


def test_identical_gpus_leave_few_configurations_and_the_floor_bounds_them_all() -> None:
    """Eight interchangeable L4s: 8 x 3^8 = 52,488 configurations, 108 up to relabelling
    (a solver visits those); the bound for configurations a time limit leaves
    unvisited is below every configuration's own bound."""
    from energyopt.families.moe_edge.solvers.milp import floor_bound, unpriced_bound

    doc = _doc(4, 1)
    gpu = dict(doc["server"]["gpus"][0], clocks_mhz=[915, 1500, 2040])
    doc["server"]["gpus"] = [dict(gpu, name=f"g{i}") for i in range(8)]
    p = _problem(doc)
    canonical = p.canonical_configs()
    assert len(p.configs()) == p.n_configs() == 52_488
    assert len(canonical) == p.n_canonical_configs() == 108
    assert set(canonical) <= set(p.configs())
    # 64 clocks each: about 2.2e15 configurations, counted without listing them
    many = dict(gpu, clocks_mhz=[*range(210, 2041, 30), 2025, 1995])
    doc["server"]["gpus"] = [dict(many, name=f"g{i}", pcie_gbps=1.0 + i) for i in range(8)]
    huge = _problem(doc)
    assert huge.n_configs() == 8 * 64**8
    assert huge.n_canonical_configs() == 8 * 64 * math.comb(7 + 63, 7)
    assert next(huge.iter_canonical_configs()).dense == 0
    small = _problem(_doc(5, 2))
    for d in range(small.n_gpus):
        floor = floor_bound(small, d)
        for c in (k for k in small.configs() if k.dense == d):
            costs = small.costs(c)
            if costs.gpu_free_gb[d] < 0:
                assert floor == np.inf  # the dense part does not fit: no plan
            else:
                assert floor <= unpriced_bound(small, costs) + 1e-12
    res = solve_milp(small, rel_gap=1e-9)
    assert res.objective is not None
    assert min(floor_bound(small, d) for d in range(small.n_gpus)) <= res.objective


def test_fiddlers_rule_runs_host_experts_on_the_cpu_below_its_token_count() -> None:
    """A host expert used by fewer tokens than the threshold in a step runs on the
    CPU, by at least that many it is fetched (and not cached)."""
    p = _problem(_doc(3, batch=4, slo={"tbt_ms": 100.0, "percentile": 90.0}))
    routing = sample_routing(p.freq, 1, 400, seed=5)
    plan = p.plan_of(p.max_clock_config(), np.full(p.n_items, p.cpu))
    as_planned = simulate(p, plan, routing, "lru")
    assert as_planned.on_cpu == as_planned.routed
    never = simulate(p, plan, routing, "lru", fetch_from_tokens=5)  # batch 4: always the CPU
    assert never.on_cpu == never.routed and never.energy_j == pytest.approx(as_planned.energy_j)
    always = simulate(p, plan, routing, "lru", cache_slots=2, fetch_from_tokens=1)
    assert always.fetched == always.routed and always.cached == 0
    assert always.pcie_bytes > 0 and always.on_cpu == 0
    split = simulate(p, plan, routing, "lru", fetch_from_tokens=2)
    assert 0 < split.fetched < split.routed and split.fetched + split.on_cpu == split.routed


def test_a_time_limit_on_eight_gpus_returns_the_best_plan_with_a_valid_bound() -> None:
    """Mixtral on 8 L4s of distinct sizes (52,488 configurations, none equal up to
    relabelling) in 1 s: most configurations are never visited; their bound comes
    from one configuration per clock rank per dense GPU, and the run says time_limit."""
    from energyopt.solvers.result import Termination

    doc = yaml.safe_load((ROOT / "instances" / "moe-edge" / "mixtral-l4-law.yaml").read_text())
    first = doc["server"]["gpus"][0]
    doc["server"]["gpus"] = [
        dict(first, name=f"gpu{i}", memory_gb=20.0 + 0.5 * i, pcie_gbps=10.0 + i) for i in range(8)
    ]
    p = build_problem(MoeEdgeFile.model_validate(doc), "<8 gpus>")
    assert len(p.canonical_configs()) == len(p.configs()) == 52_488
    for solve in (solve_milp, solve_lagrangian):
        res = solve(p, time_limit_s=1.0)
        assert res.termination == Termination.TIME_LIMIT and res.status != OPTIMAL
        assert res.bound is not None and res.bound > 0
        if res.plan is not None:
            assert evaluate_moe_edge(p.spec, builtin_catalog(), res.plan).violations == []
            assert res.objective is not None and res.bound <= res.objective


@pytest.mark.parametrize("tiny", [1e-30, 1e-300])
def test_an_expert_almost_never_picked_is_costed_not_divided_by_zero(
    tmp_path: Path, tiny: float
) -> None:
    """1 - (1 - f)^b rounds to 0 for f below about 1e-16: the verifier divided by it
    (ZeroDivisionError in solve and verify). The bundled file with one frequency at
    ``tiny`` solves, and its plan verifies with the objective the solver reports."""
    doc = yaml.safe_load(BUNDLED.read_text())
    doc["activations"]["layers"][5]["frequencies"][33] = tiny
    path = tmp_path / "tiny-frequency.yaml"
    path.write_text(yaml.safe_dump(doc))
    fam = family("moe-edge")
    p = fam.load(str(path), [])
    res = fam.solve(p, "lagrangian", time_limit_s=5, rel_gap=1e-6, progress=lambda _: None)
    assert res.plan is not None and fam.verify(p, res.plan) == []
    certify(fam, p, res, 1e-6, lambda _: None)
    ev = evaluate_moe_edge(MoeEdgeFile.model_validate(doc), builtin_catalog(), res.plan)
    assert ev.cost == pytest.approx(res.objective, rel=1e-9)
