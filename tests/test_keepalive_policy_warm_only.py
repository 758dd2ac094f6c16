"""The tepid table of a function without a tepid state, priced on the K + 1 equal
threshold pairs only, picks what the whole (K + 1) x (K + 1) grid picks."""

from __future__ import annotations

import numpy as np
import pytest

from energyopt.families.keepalive.formulations import policy as P
from energyopt.families.keepalive.spec import Function


def _cpu_function(warm_w: float, load_j: float, load_s: float) -> Function:
    return Function.model_validate(
        {
            "name": "cpu-f",
            "warm": {"gpu_memory_gb": 0.0, "host_memory_gb": 0.2, "power_w": warm_w},
            "cold_start": {"time_s": load_s, "energy_j": load_j},
            "service": {"time_s": 0.5, "power_w": 15.0},
            "arrivals": [1],
        }
    )


def _over_grid(
    fn: Function, h: P.IdleHistogram, late_share: float, cold_share: float, ref: float | None
) -> P.TepidTable:
    """compile_tepid's choice computed over every pair of price_thresholds."""
    prices = P.price_thresholds(fn, h, 15.0)
    cold_limit = cold_share if ref is None else min(cold_share, P.fixed_cold_share(h, ref))
    excess = np.maximum(prices.late - late_share, 0.0) + np.maximum(prices.cold - cold_limit, 0.0)
    excess = np.where(prices.usable, excess, np.inf)
    pick = np.where(prices.usable & (excess <= excess.min() + 1e-12), prices.energy_j, np.inf)
    i, j = np.unravel_index(int(np.argmin(pick)), pick.shape)
    return P._table(float(prices.edges[i]), float(prices.edges[max(i, j)]), h)


@pytest.mark.parametrize("seed", range(6))
def test_warm_only_table_is_the_whole_grids_choice(seed: int) -> None:
    rng = np.random.default_rng(seed)
    fn = _cpu_function(
        float(rng.choice([0.02, 1.0, 50.0])), float(rng.choice([10.0, 100.0])),
        float(rng.choice([1.0, 20.0])),
    )  # fmt: skip
    for _ in range(25):
        h = P.IdleHistogram.empty()
        scale = float(rng.choice([30.0, 300.0, 3000.0, 30000.0]))
        for x in rng.exponential(scale, size=int(rng.integers(0, 40))):
            h.add(float(x))
        late = float(rng.choice([0.0, 0.01, 0.5]))
        cold = float(rng.choice([0.0, 0.05, 1.0]))
        ref = rng.choice([None, 600.0])
        ref_s = None if ref is None else float(ref)
        assert fn.tepid is None
        assert P.compile_tepid(fn, h, 15.0, late, cold, ref_s) == _over_grid(
            fn, h, late, cold, ref_s
        )


def test_cheap_warm_function_stays_warm() -> None:
    """0.02 W warm against a 100 J load: holding warm is cheaper than any load within
    the four-hour range, so the table never goes cold on the grid."""
    h = P.IdleHistogram.empty()
    for x in (30.0, 900.0, 2400.0):
        h.add(x)
    table = P.compile_tepid(_cpu_function(0.02, 100.0, 1.0), h, 15.0, 0.01, 0.05, 600.0)
    assert table.warm_until_s == table.tepid_until_s == P.RANGE_BINS * P.BIN_S
