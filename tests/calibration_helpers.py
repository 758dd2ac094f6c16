"""Clock-sweep CSV files that the performance model itself predicts, for the tests of
the clock-constant fit and of ``energyopt calibrate``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from energyopt.catalog import builtin_catalog
from energyopt.nvml.profile import COLUMNS
from energyopt.perf.clockfit import KernelSweep, predict, with_constants

KERNELS = (("matmul", 3e14, 1e9), ("memory", 0.0, 2e12))
"""(kernel, FLOP, bytes) of each kernel a sweep runs: one compute-bound, one memory-bound."""


def write_model_sweep(
    path: Path,
    gpu_name: str,
    *,
    kernels: tuple[tuple[str, float, float], ...] = KERNELS,
    compute_fixed: float = 0.35,
    floor: float = 0.82,
    knee: float = 0.62,
) -> None:
    """Write to ``path`` the sweep the model predicts for ``gpu_name`` with the clock
    constants ``compute_fixed``, ``floor`` (voltage floor) and ``knee`` (knee
    fraction): each of ``kernels`` at every sixth supported clock from 900 MHz, its
    seconds and joules."""
    gpu = builtin_catalog().gpu(gpu_name)
    truth = with_constants(gpu, compute_fixed, floor, knee)
    clocks = np.asarray([c for c in gpu.sm_clocks_mhz() if c >= 900][::6], dtype=np.float64)
    rows = []
    for kernel, flops, nbytes in kernels:
        n = len(clocks)
        sweep = KernelSweep(
            kernel, clocks, np.full(n, flops), np.full(n, nbytes), np.ones(n), np.ones(n)
        )
        t, w = predict(truth, sweep)
        rows += [(kernel, c, flops, nbytes, s, s * p) for c, s, p in zip(clocks, t, w, strict=True)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
