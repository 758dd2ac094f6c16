"""Interference: ground-truth properties and the learned predictor's error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.families.colocation.formulations.interference import (
    PairFeatures,
    default_predictor,
    predictor_error,
    sample_features,
    true_slowdown,
)
from energyopt.families.colocation.formulations.measured import (
    BASELINES,
    GAVEL_FILE,
    PREDICTOR,
    MeasuredCluster,
    MeasuredJob,
    MeasuredPairs,
    MeasuredPlan,
    MeasuredUnit,
    PairModelSpec,
    cross_validate,
    fit_pair_model,
    held_out_slowdown,
    load_gavel,
    measured_jobs,
)
from energyopt.families.colocation.solvers.measured import (
    schedule_isolated,
    schedule_paired,
)
from energyopt.families.colocation.verify_measured import check_measured_plan
from energyopt.spec.errors import SpecError

unit = st.floats(0.0, 1.0)


def features(**kw: float) -> PairFeatures:
    base = dict(
        active_a=1.0,
        active_b=1.0,
        bw_a=0.3,
        bw_b=0.3,
        mem_bound_a=0.5,
        footprint_a=0.2,
        footprint_b=0.2,
        occupancy_a=0.3,
        occupancy_b=0.3,
    )
    base.update(kw)
    return PairFeatures(**{k: np.asarray([v]) for k, v in base.items()})


@settings(max_examples=60, deadline=None)
@given(unit, unit, unit, unit, unit, st.floats(0.0, 0.5))
def test_ground_truth_is_at_least_one_and_grows_with_the_partners_bandwidth(
    bw_a: float, bw_b: float, mem_bound: float, act_a: float, act_b: float, more: float
) -> None:
    f = features(bw_a=bw_a, bw_b=bw_b, mem_bound_a=mem_bound, active_a=act_a, active_b=act_b)
    g = features(
        bw_a=bw_a,
        bw_b=min(bw_b + more, 1.0),
        mem_bound_a=mem_bound,
        active_a=act_a,
        active_b=act_b,
    )
    assert true_slowdown(f)[0] >= 1.0
    assert true_slowdown(g)[0] >= true_slowdown(f)[0] - 1e-12


def test_idle_phases_hide_interference() -> None:
    """A partner that is idle half the time interferes half as much."""
    busy = true_slowdown(features(bw_a=0.8, bw_b=0.8, active_b=1.0))[0]
    half = true_slowdown(features(bw_a=0.8, bw_b=0.8, active_b=0.5))[0]
    assert half - 1.0 == np.float64(0.5) * (busy - 1.0)
    assert true_slowdown(features(active_b=0.0))[0] == 1.0


def test_two_bandwidth_heavy_jobs_slow_each_other_far_more() -> None:
    light = true_slowdown(features(bw_a=0.2, bw_b=0.2, mem_bound_a=0.3))[0]
    heavy = true_slowdown(features(bw_a=0.8, bw_b=0.8, mem_bound_a=0.9))[0]
    assert heavy - 1.0 > 5 * (light - 1.0)


def test_predictor_error_on_held_out_pairs() -> None:
    err = predictor_error()
    assert err.pairs == 2000
    assert err.mape < 0.05  # documented in docs/formulations/colocation.md
    assert err.mape > 0.0  # the predictor is not the ground truth


def test_predictor_tracks_the_truth_and_never_predicts_a_speedup() -> None:
    f = sample_features(500, np.random.default_rng(3))
    pred, truth = default_predictor()(f), true_slowdown(f)
    assert np.all(pred >= 1.0)
    assert np.corrcoef(pred, truth)[0, 1] > 0.95


def test_pareto_mask_drops_dominated_rows_per_group() -> None:
    from energyopt.families.colocation.formulations.configs import pareto_mask

    groups = np.asarray([0, 0, 0, 0, 1, 1])
    metrics = np.asarray([[1.0, 5.0], [2.0, 4.0], [2.0, 5.0], [1.0, 5.0], [3.0, 3.0], [1.0, 1.0]])
    # row 2 is dominated by row 1, row 3 ties row 0 (one kept), row 4 by row 5
    assert pareto_mask(groups, metrics).tolist() == [True, True, False, False, False, True]


# --- measured pairs (Gavel, data/sharing/gavel): predictor, held-out error, schedules ---

@pytest.fixture(scope="module")
def gavel(shared_data: Path) -> MeasuredPairs:
    return load_gavel(shared_data / GAVEL_FILE)


def test_gavel_measurements_load_with_both_orders_agreeing(gavel: MeasuredPairs) -> None:
    assert gavel.gpu_types == ("k80", "p100", "v100")
    assert len(gavel.job_types) == 26
    runs = gavel.runs()
    assert np.array_equal(runs, np.swapaxes(runs, 1, 2))  # a pair runs in both orders or neither
    assert 1800 < runs.sum() < 26 * 26 * 3  # some pairs did not run (out of memory)
    # ResNet-50 at batch 128 does not fit a K80 alone
    assert gavel.alone[0, gavel.job_types.index("ResNet-50 (batch size 128)")] == 0.0
    sigma = gavel.slowdown()[runs]
    assert np.median(sigma) > 1.3  # sharing a whole GPU slows a training job


def test_gavel_pair_measured_differently_in_its_two_orders_is_refused(
    shared_data: Path, tmp_path: Path
) -> None:
    raw = json.loads((shared_data / GAVEL_FILE).read_text())
    a, b = "('A3C', 1)", "('CycleGAN', 1)"
    raw["p100"][a][b] = [raw["p100"][a][b][0] * 1.5, raw["p100"][a][b][1]]
    bad = tmp_path / "throughputs.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as exc:
        load_gavel(bad)
    message = str(exc.value)
    assert str(bad) in message and "p100" in message and "'A3C'" in message
    del raw["p100"][a]["null"]
    bad.write_text(json.dumps(raw))
    with pytest.raises(SpecError, match=r"p100\.\('A3C', 1\): no 'null'"):
        load_gavel(bad)


def test_low_rank_fit_recovers_a_known_low_rank_table() -> None:
    """Noise-free log slowdowns of the model's own form, 30 % of entries hidden."""
    rng = np.random.default_rng(0)
    g, n, rank = 2, 12, 2
    p, q = rng.normal(0, 0.5, (g, n, rank)), rng.normal(0, 0.5, (g, n, rank))
    truth = (
        rng.uniform(0.2, 0.6, (g, 1, 1))
        + rng.normal(0, 0.3, (g, n, 1))
        + rng.normal(0, 0.3, (g, 1, n))
        + np.einsum("gar,gbr->gab", p, q)
    )
    seen = rng.uniform(size=truth.shape) > 0.3
    spec = PairModelSpec("test", rank=rank, ridge=1e-3, iterations=300)
    model = fit_pair_model(truth, seen, spec)
    err = np.abs(model.log_slowdown() - truth)
    assert err[seen].max() < 0.02
    assert np.median(err[~seen]) < 0.05
    additive = fit_pair_model(truth, seen, PairModelSpec("additive", ridge=1e-3))
    assert np.median(np.abs(additive.log_slowdown() - truth)[~seen]) > 3 * np.median(err[~seen])


def test_predictor_error_on_held_out_measured_pairs(gavel: MeasuredPairs) -> None:
    """5-fold over unordered pairs (each held out in both orders on every GPU type);
    the bound is the one stated in docs/formulations/colocation.md."""
    err = cross_validate(gavel, PREDICTOR)
    assert err.entries == int(gavel.runs().sum())
    assert err.mape < 0.12
    for baseline in BASELINES:
        assert cross_validate(gavel, baseline).mape > err.mape + 0.02, baseline.name


def test_schedules_from_the_predictor_verify_on_the_measurements(gavel: MeasuredPairs) -> None:
    sigma = held_out_slowdown(gavel)
    cluster = MeasuredCluster(gavel.gpu_types, (1, 2, 1))
    jobs = measured_jobs(gavel, 16, seed=5)
    plans = [
        schedule_isolated(gavel, sigma, cluster, jobs, shortest_first=False),
        schedule_isolated(gavel, sigma, cluster, jobs),
        schedule_paired(gavel, sigma, cluster, jobs),
    ]
    for plan in plans:
        outcome = check_measured_plan(gavel, cluster, jobs, plan)
        assert outcome.ok, outcome.violations
        assert set(outcome.completion_s) == {j.name for j in jobs}
        # scored with the table it planned with, the checker reproduces its objective
        own = check_measured_plan(gavel, cluster, jobs, plan, sigma=sigma)
        assert own.mean_jct_s == pytest.approx(plan.objective_s, rel=1e-12)
    paired = plans[2]
    assert any(len(u.jobs) == 2 for u in paired.units)
    assert paired.objective_s < plans[1].objective_s  # pairs are kept only when they help


def test_checker_refuses_what_the_measurements_rule_out(gavel: MeasuredPairs) -> None:
    cluster = MeasuredCluster(gavel.gpu_types, (1, 1, 1))
    k80 = 0
    runs = gavel.runs()
    fits = gavel.alone[k80] > 0
    a, b = (int(x[0]) for x in np.nonzero(~runs[k80] & fits[:, None] & fits[None, :]))
    big = gavel.job_types.index("ResNet-50 (batch size 128)")
    jobs = [MeasuredJob("a", a, 100.0), MeasuredJob("b", b, 100.0), MeasuredJob("c", big, 10.0)]

    def check(*units: MeasuredUnit) -> tuple[str, ...]:
        return check_measured_plan(gavel, cluster, jobs, MeasuredPlan(units, 0.0, "t")).violations

    ok = (MeasuredUnit("v100/0", 0.0, ("c",)),)
    assert check(MeasuredUnit("k80/0", 0.0, ("a", "b")), *ok) == (
        f"units[0]: the pair {[gavel.job_types[a], gavel.job_types[b]]} did not run on k80",
    )
    assert check(MeasuredUnit("p100/0", 0.0, ("a", "b")), MeasuredUnit("k80/0", 0.0, ("c",))) == (
        "units[1]: c does not run on k80",
    )
    assert "job b is in no unit" in check(MeasuredUnit("p100/0", 0.0, ("a",)), *ok)
    assert "job a is in 2 units" in check(
        MeasuredUnit("p100/0", 0.0, ("a", "b")), MeasuredUnit("v100/0", 0.0, ("a", "c"))
    )
    assert "units[0]: unknown GPU v100/7" in check(MeasuredUnit("v100/7", 0.0, ("a", "b")), *ok)
    assert "units[0]: start -1.0 s is not a time >= 0" in check(
        MeasuredUnit("p100/0", -1.0, ("a", "b")), *ok
    )
