"""Serverless regressions from fuzzing: a clock the GPU does not support is refused
by validate, solve and the verifier; the decode drain after the last epoch is
charged alike by the formulation, the fast algorithm and the verifier; inputs at
the documented size limits end within the time limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.catalog.loader import builtin_catalog
from energyopt.cli import EXIT_BAD_INPUT, main
from energyopt.families import family
from energyopt.families.serverless.family import MAX_PROGRAM_COLUMNS
from energyopt.families.serverless.formulations.milp import build_milp, program_size
from energyopt.families.serverless.formulations.model import ServerlessProblem, build_problem
from energyopt.families.serverless.spec import MAX_EPOCHS, ServerlessFile, ServerlessPlan
from energyopt.families.serverless.verify import evaluate_serverless
from energyopt.solvers.result import NO_SOLUTION, Termination

from .spec_docs import tiny_serverless_doc as _doc

QUIET = lambda _msg: None  # noqa: E731
GPU = "H100-SXM5-80GB"


# --- clocks the GPU does not support ----------------------------------------------


def test_an_unsupported_clock_is_refused_by_validate_and_solve(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    gpu = builtin_catalog().gpu(GPU)
    assert 886 not in gpu.sm_clocks_mhz()
    assert gpu.min_sm_clock_mhz < 886 < gpu.max_sm_clock_mhz  # within range, off the grid
    path = tmp_path / "off-grid.yaml"
    path.write_text(yaml.safe_dump(_doc(options={"shares_pct": [50, 100], "clocks_mhz": [886]})))
    for verb in (["validate"], ["solve", "--time-limit", "5"]):
        code = main([verb[0], str(path), *verb[1:]])
        _, err = capfd.readouterr()
        assert code == EXIT_BAD_INPUT, verb
        assert f"{path}: options.clocks_mhz: 886 MHz is not a supported SM clock" in err, verb
        assert "885, 900" in err and "Traceback" not in err


def test_the_verifier_refuses_a_pool_at_an_unsupported_clock() -> None:
    """The file's own list cannot make a clock valid: the verifier checks the GPU's."""
    spec = ServerlessFile.model_validate(
        _doc(options={"shares_pct": [100], "clocks_mhz": [886, 1980]})
    )
    good = build_problem(ServerlessFile.model_validate(_doc(options={"shares_pct": [100]})))
    fam = family("serverless")
    res = fam.solve(good, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None and fam.verify(good, res.plan) == []
    off = ServerlessPlan(
        epochs=tuple(
            ep.model_copy(
                update={"pools": tuple(p.model_copy(update={"clock_mhz": 886}) for p in ep.pools)}
            )
            for ep in res.plan.epochs
        )
    )
    ev = evaluate_serverless(spec, builtin_catalog(), off)
    clocks = [v for v in ev.violations if "not a supported SM clock" in v.message]
    assert clocks and len(clocks) == sum(len(ep.pools) for ep in off.epochs)


# --- the horizon's ends and lulls -------------------------------------------------


def _chat(demand: list[float]) -> dict[str, Any]:
    return dict(_doc()["models"][0], demand_rps=demand)


def test_decode_instances_of_the_last_epoch_drain_in_every_solver_and_the_verifier() -> None:
    """A plan ends with no instances: the verifier bills each decode instance of the
    last epoch its drain (output mean x TBT SLO), and every solver's objective is
    that cost."""
    p = build_problem(ServerlessFile.model_validate(_doc(models=[_chat([12.0])])))
    fam = family("serverless")
    drain_s = 211 * 50 / 1e3
    for name in ("milp", "lp", "fast", "rolling"):
        res = fam.solve(p, name, time_limit_s=20, rel_gap=1e-9, progress=QUIET)
        assert res.plan is not None and fam.verify(p, res.plan) == [], name
        ev = evaluate_serverless(p.spec, builtin_catalog(), res.plan)
        decode = [x for x in res.plan.epochs[0].pools if x.phase == "decode"]
        held = sum(x.count * x.share_pct / 100 * x.tp for x in decode)
        assert ev.stops == sum(x.count for x in decode) > 0, name
        assert ev.drain_gpu_s == pytest.approx(held * drain_s, rel=1e-12), name
        assert res.objective == pytest.approx(ev.cost, rel=1e-9), name


def test_the_exact_plan_holds_an_instance_through_a_short_lull() -> None:
    """5-s epochs, demand 10 / 0 / 10 rps: an idle decode instance held through the
    empty epoch (5 s) costs less than its drain (10.55 s) and a cold start, so the
    optimum keeps one, which the per-epoch heuristics cannot see."""
    doc = _doc(epoch_s=5, models=[_chat([10.0, 0.0, 10.0])])
    p = build_problem(ServerlessFile.model_validate(doc))
    fam = family("serverless")
    exact = fam.solve(p, "milp", time_limit_s=20, rel_gap=1e-9, progress=QUIET)
    fast = fam.solve(p, "fast", time_limit_s=20, rel_gap=1e-9, progress=QUIET)
    assert exact.plan is not None and fast.plan is not None
    assert fam.verify(p, exact.plan) == []
    lull = exact.plan.epochs[1].pools
    assert lull and all(x.rate_rps == 0 for x in lull)
    assert exact.objective is not None and fast.objective is not None
    assert exact.objective < fast.objective - 1.0
    assert exact.objective == pytest.approx(fam.cost(p, exact.plan), rel=1e-9)


# --- the documented size limits within the time limit ------------------------------


def _at_the_limits(epochs: int, nodes: int, gpus: int) -> ServerlessProblem:
    """A file at the spec's limits: ``epochs`` epochs (10,080 at most), ``nodes``
    nodes (256 at most) of ``gpus`` GPUs (64 at most), demand cycling 8..14 rps."""
    demand = [8.0 + t % 7 for t in range(epochs)]
    doc = _doc(
        nodes=[{"name": f"n{i}", "gpus": gpus} for i in range(nodes)],
        options={"shares_pct": [25, 50, 100], "max_batch": 64},
        models=[_chat(demand)],
    )
    return build_problem(ServerlessFile.model_validate(doc))


@pytest.fixture(scope="module")
def longest() -> ServerlessProblem:
    return _at_the_limits(MAX_EPOCHS, 2, 2)


def test_the_program_of_the_longest_horizon_is_built_as_estimated(
    longest: ServerlessProblem,
) -> None:
    """10,080 epochs: the MILP (built with array operations; it took minutes when
    its rows were gathered pool by pool) has the size ``auto`` and the time budget
    read from ``program_size`` without building it."""
    milp = build_milp(longest)
    pools, columns = program_size(longest)
    assert (milp.n_pools, len(milp)) == (pools, columns)
    assert milp.n_pools >= 3 * MAX_EPOCHS  # every epoch has prefill and decode pools


def test_every_solver_stops_at_its_time_limit_with_a_reason(longest: ServerlessProblem) -> None:
    """A limit far too short for 10,080 epochs: every solver returns no plan, says
    that the time limit ended it, and claims no bound it did not prove."""
    fam = family("serverless")
    for entry in fam.solvers():
        res = fam.solve(longest, entry.name, time_limit_s=1e-3, rel_gap=1e-4, progress=QUIET)
        assert res.plan is None and res.status == NO_SOLUTION, entry.name
        assert res.termination is Termination.TIME_LIMIT, (entry.name, res.log)
        assert any("time limit" in line for line in res.log), (entry.name, res.log)
        assert res.bound is None, entry.name


def test_a_program_too_large_to_build_gives_the_fast_plan_without_a_bound() -> None:
    """256 nodes of 64 GPUs for 100 epochs: 6.5 million route columns, over
    MAX_PROGRAM_COLUMNS, so ``milp`` builds nothing and returns the fast plan,
    verified, with no bound and the reason in its log."""
    p = _at_the_limits(100, 256, 64)
    assert program_size(p)[1] > MAX_PROGRAM_COLUMNS
    fam = family("serverless")
    for name in ("milp", "lp", "auto"):
        res = fam.solve(p, name, time_limit_s=60, rel_gap=1e-4, progress=QUIET)
        assert res.plan is not None and fam.verify(p, res.plan) == [], name
        assert res.bound is None and "plan from the fast algorithm" in res.algorithm, name
        assert any("not built" in line for line in res.log), (name, res.log)
        assert res.objective == pytest.approx(fam.cost(p, res.plan), rel=1e-9)
