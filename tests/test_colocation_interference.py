"""Interference: ground-truth properties and the learned predictor's error."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.formulations.colocation.interference import (
    PairFeatures,
    default_predictor,
    predictor_error,
    sample_features,
    true_slowdown,
)

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
    from energyopt.formulations.colocation.configs import pareto_mask

    groups = np.asarray([0, 0, 0, 0, 1, 1])
    metrics = np.asarray([[1.0, 5.0], [2.0, 4.0], [2.0, 5.0], [1.0, 5.0], [3.0, 3.0], [1.0, 1.0]])
    # row 2 is dominated by row 1, row 3 ties row 0 (one kept), row 4 by row 5
    assert pareto_mask(groups, metrics).tolist() == [True, True, False, False, False, True]
