"""The tepid table's idle-time grid (1-s bins to one minute, then 1-minute bins to
four hours) and its pause rule: a busy function with idle times of seconds gets a
table that pauses within seconds where that is cheaper, the prices on the new grid
are the expected energy summed idle time by idle time, and no pause falls between
0 and the break-even time."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from energyopt.families.keepalive.formulations import policy as P
from energyopt.families.keepalive.sim import simulate
from energyopt.families.keepalive.spec import Function


def _function(enter_j: float, resume_j: float) -> Function:
    return Function.model_validate(
        {
            "name": "f",
            "warm": {"gpu_memory_gb": 20, "host_memory_gb": 2, "power_w": 20},
            "tepid": {
                "gpu_memory_gb": 0.5,
                "host_memory_gb": 18,
                "power_w": 2,
                "enter_s": 0.2,
                "enter_j": enter_j,
                "resume_s": 0.5,
                "resume_j": resume_j,
            },
            "cold_start": {"time_s": 5, "energy_j": 900},
            "service": {"time_s": 1, "power_w": 300},
            "arrivals": [1],
        }
    )


QUICK = _function(20.0, 40.0)
"""A pause and resume of 60 J against 18 W saved: pays back after 3.3 s."""
SLOW = _function(100.0, 300.0)
"""A pause and resume of 400 J: pays back after 22.2 s."""


def _expected(fn: Function, w: float, u: float, xs: list[float], ps: list[float]) -> float:
    """Expected energy, J, of thresholds (w, u) over idle times ``xs`` with
    probabilities ``ps``, summed idle time by idle time."""
    tep = fn.tepid
    assert tep is not None
    total = 0.0
    for x, p in zip(xs, ps, strict=True):
        e = fn.warm.power_w * min(x, w)
        if x >= w and u > w:
            e += tep.enter_j + tep.power_w * (min(x, u) - w)
            if x < u:
                e += tep.resume_j
        if x >= u:
            e += fn.cold_start.energy_j
        total += p * e
    return total


def test_the_grid_is_fine_to_a_minute_then_coarse_to_four_hours() -> None:
    edges = P.TABLE_EDGES_S
    assert edges[0] == 0.0 and edges[-1] == P.RANGE_BINS * P.BIN_S
    assert np.all(np.diff(edges)[:60] == 1.0) and np.all(np.diff(edges)[60:] == P.BIN_S)
    assert P.TABLE_BINS == 60 + P.RANGE_BINS - 1
    h = P.IdleHistogram.empty()
    for x in (0.0, 0.4, 1.0, 59.9, 60.0, 119.0, 14_399.0, 14_400.0):
        h.add(x)
    assert list(np.flatnonzero(h.table_counts)) == [0, 1, 59, 60, 298]
    assert list(h.table_counts[[0, 1, 59, 60, 298]]) == [2, 1, 1, 2, 1]
    assert h.out_of_range == 1 and h.samples == 8
    # the hybrid policy's 1-minute histogram is unchanged
    assert list(np.flatnonzero(h.counts)) == [0, 1, 239] and h.counts[0] == 4
    with pytest.raises(ValueError, match="idle_s"):
        h.add(-1.0)


def test_a_busy_function_pauses_within_seconds_where_that_is_cheaper() -> None:
    rng = random.Random(3)
    h = P.IdleHistogram.empty()
    for _ in range(300):  # seven in ten idle times about 1 s, the rest 8 to 20 s
        h.add(rng.uniform(0.5, 1.5) if rng.random() < 0.7 else rng.uniform(8.0, 20.0))
    table = P.compile_tepid(QUICK, h, 10.0, 0.01, 0.05, 600.0)
    # warm through the 1-s idle times, paused for the 8-20 s ones, never cold before 10 min
    assert 1.5 <= table.warm_until_s <= 8.0
    assert table.lookup(1.0) == "warm" and table.lookup(8.0) == "tepid"
    assert table.lookup(20.0) == "tepid" and table.tepid_until_s >= 600.0
    # cheaper than any table on the 1-minute grid (pause at once or after a minute)
    xs, ps = P.idle_distribution(h)
    mine = _expected(QUICK, table.warm_until_s, table.tepid_until_s, list(xs), list(ps))
    coarse = min(
        _expected(QUICK, w, u, list(xs), list(ps))
        for w in (0.0, 60.0)
        for u in (600.0, 660.0, P.RANGE_BINS * P.BIN_S)
    )
    assert mine < 0.95 * coarse
    # the replay agrees: the table spends less than holding warm or pausing at once
    arrivals, t = [], 0.0
    for _ in range(200):
        t += 1.0 + (rng.uniform(0.5, 1.5) if rng.random() < 0.7 else rng.uniform(8.0, 20.0))
        arrivals.append(t)
    horizon = t + 2.0

    def tabled(hist: P.IdleHistogram) -> list[P.Phase]:
        return P.compile_tepid(QUICK, hist, 10.0, 0.01, 0.05, 600.0).phases()

    got = simulate(QUICK, arrivals, tabled, horizon)
    warm = simulate(QUICK, arrivals, lambda _h: P.always_warm(), horizon)
    pause = simulate(QUICK, arrivals, lambda _h: [("tepid", math.inf)], horizon)
    assert got.cold_starts == warm.cold_starts == 1
    assert got.tepid_starts > 0
    assert got.energy_j < min(warm.energy_j, pause.energy_j)


def test_prices_on_the_fine_grid_are_the_expected_energy_of_each_idle_time() -> None:
    """Every idle time alone in its bin (so priced at itself) and the prior's weight
    on every bin at its centre: the expectation summed term by term."""
    rng = random.Random(11)
    h = P.IdleHistogram.empty()
    bins = rng.sample(range(P.TABLE_BINS), 40)
    seen = [float(rng.uniform(P.TABLE_EDGES_S[b], P.TABLE_EDGES_S[b + 1])) for b in bins]
    seen.append(30_000.0)  # beyond the range: priced at twice the range
    for x in seen:
        h.add(x)
    centres = (P.TABLE_EDGES_S[:-1] + P.TABLE_EDGES_S[1:]) / 2
    prior = P.PRIOR_WEIGHT / (P.TABLE_BINS + 1)
    total = len(seen) + P.PRIOR_WEIGHT
    xs = [*seen[:-1], 2.0 * float(P.TABLE_EDGES_S[-1])]
    ps = [1.0 / total] * len(seen)
    for b in range(P.TABLE_BINS):
        xs.append(seen[bins.index(b)] if b in bins else float(centres[b]))
        ps.append(prior / total)
    xs.append(2.0 * float(P.TABLE_EDGES_S[-1]))
    ps.append(prior / total)
    assert sum(ps) == pytest.approx(1.0)
    prices = P.price_thresholds(SLOW, h, 10.0)
    fine = [i for i, e in enumerate(prices.edges) if e <= 60.0]
    for _ in range(150):
        i = rng.choice(fine)
        j = rng.choice([i, rng.choice(fine), rng.randrange(i, len(prices.edges))])
        i, j = min(i, j), max(i, j)
        w, u = float(prices.edges[i]), float(prices.edges[j])
        assert prices.energy_j[i, j] == pytest.approx(_expected(SLOW, w, u, xs, ps), rel=1e-9)


def test_no_pause_between_zero_and_the_break_even_time() -> None:
    assert P.pause_break_even_s(SLOW) == pytest.approx(400.0 / 18.0)
    assert P.pause_break_even_s(SLOW.model_copy(update={"tepid": None})) == math.inf
    rng = random.Random(5)
    h = P.IdleHistogram.empty()
    for _ in range(100):
        h.add(rng.uniform(0.0, 10.0))  # every idle time so far under 10 s
    prices = P.price_thresholds(SLOW, h, 10.0)
    w, u = prices.edges[:, None], prices.edges[None, :]
    rule = (u >= w) & ((u == w) | (w == 0) | (w >= 400.0 / 18.0))
    assert np.array_equal(prices.allowed, rule) and np.array_equal(prices.usable, u >= w)
    # unrestricted, the cheapest pause is just past the longest idle time seen (the
    # posterior puts the unseen mass hours away); the table waits for break-even
    unrestricted = np.where(prices.usable & (u >= 600.0), prices.energy_j, np.inf)
    i, _ = np.unravel_index(int(np.argmin(unrestricted)), unrestricted.shape)
    assert 10.0 <= prices.edges[i] < 400.0 / 18.0
    table = P.compile_tepid(SLOW, h, 10.0, 0.01, 0.05, 600.0)
    assert table.warm_until_s >= 400.0 / 18.0
    # for any one idle time, the first edge past break-even costs at most twice
    # the cheaper of holding warm and pausing at once, plus one bin of warm power
    tep = SLOW.tepid
    assert tep is not None
    b = float(prices.edges[np.searchsorted(prices.edges, 400.0 / 18.0)])
    for x in np.linspace(0.0, 600.0, 601):
        at_b = _expected(SLOW, b, math.inf, [float(x)], [1.0])
        best = min(SLOW.warm.power_w * x, tep.enter_j + tep.power_w * x + tep.resume_j)
        assert at_b <= 2.0 * best + SLOW.warm.power_w * 1.0 + 1e-9
