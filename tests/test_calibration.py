"""The shipped constants reproduce the public measured tables within the stated error.

Bounds are the ones docs/performance-model.md states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.perf.fitting import Tables, latency_errors, power_errors

CALIBRATED = ["A100-SXM4-80GB", "H100-SXM5-80GB"]


@pytest.mark.parametrize("gpu", CALIBRATED)
def test_latency_error_within_documented_bounds(shared_data: Path, gpu: str) -> None:
    catalog = builtin_catalog()
    stats = latency_errors(catalog, Tables(shared_data), catalog.gpu(gpu))
    assert len(stats) >= 5
    for s in stats:
        if s.table.startswith("vidur"):
            assert s.median_ape <= 0.12, s.line()
            assert s.p90_ape <= 0.25, s.line()
        else:
            assert s.median_ape <= 0.20, s.line()


@pytest.mark.parametrize("gpu", CALIBRATED)
def test_power_error_within_documented_bounds(shared_data: Path, gpu: str) -> None:
    catalog = builtin_catalog()
    stats = power_errors(catalog, Tables(shared_data), catalog.gpu(gpu))
    by_kind = {s.table.split(" ", 2)[-1]: s for s in stats}
    assert by_kind["token power"].median_ape <= 0.10
    assert by_kind["prompt power"].median_ape <= 0.20
    for name, s in by_kind.items():
        if name.endswith("average power"):
            assert s.median_ape <= 0.15, s.line()


def test_an_uncalibrated_model_would_fail_the_bounds(shared_data: Path) -> None:
    """The bounds are tight enough to catch wrong constants."""
    catalog = builtin_catalog()
    gpu = catalog.gpu("H100-SXM5-80GB")
    off = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"memory": 0.4})})
    worst = max(s.median_ape for s in latency_errors(catalog, Tables(shared_data), off))
    assert worst > 0.20
