"""Which SM clocks a problem considers: the one rule every family uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from energyopt.spec.hardware import GpuType

CLOCK_RANGE_FLOOR = 0.45
"""Default candidate clocks go no lower than this fraction of the max clock."""


def spread_clocks_mhz(gpu: GpuType, count: int, low_mhz: float) -> tuple[int, ...]:
    """Up to ``count`` supported clocks nearest to evenly spaced targets from
    ``low_mhz`` to the max clock (MHz, ascending; fewer where targets coincide)."""
    if count <= 1:
        return (gpu.max_sm_clock_mhz,)
    supported = np.asarray(gpu.sm_clocks_mhz(), dtype=np.float64)
    targets = np.linspace(gpu.max_sm_clock_mhz, max(low_mhz, gpu.min_sm_clock_mhz), count)
    return tuple(sorted({int(supported[np.argmin(np.abs(supported - t))]) for t in targets}))


def candidate_clocks_mhz(
    gpu: GpuType, given: Mapping[str, Sequence[int]] | None, count: int
) -> tuple[int, ...]:
    """The clocks a file lists for ``gpu`` (``clocks_mhz``), else ``count`` spread
    down to CLOCK_RANGE_FLOOR of the max (MHz, ascending)."""
    if given and gpu.name in given:
        return tuple(sorted(set(given[gpu.name])))
    return spread_clocks_mhz(gpu, count, CLOCK_RANGE_FLOOR * gpu.max_sm_clock_mhz)
