"""The queueing model against the simulator on a reduced grid (benchmarks/queueing.py
runs the full one), and planning with a latency margin."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from energyopt.catalog import builtin_catalog
from energyopt.perf.forward import decode_pass
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.queueing import metrics_at, slo_capacity
from energyopt.spec import Options, Slo, TokenDist, Workload
from energyopt.spec.evaluation import PlannerSpec

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "queueing.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("queueing_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("queueing_bench", module)
    spec.loader.exec_module(module)
    return module


BENCH = load_script()


@pytest.mark.parametrize(
    ("shape", "gpu", "clock"),
    [
        (BENCH.GRID_SHAPES[0], "H100-SXM5-80GB", 1980),
        (BENCH.GRID_SHAPES[0], "A100-SXM4-80GB", 1110),
        (BENCH.GRID_SHAPES[1], "H100-SXM5-80GB", 990),
    ],
)
def test_p99_latencies_match_the_simulator(shape, gpu: str, clock: int) -> None:
    """Within 15 % of the simulated P99 TTFT and TBT, never more than 10 % below, at a
    light and a heavy load (the old M/M/1 tail was 40-110 % above on TTFT)."""
    points = BENCH.compare(shape, gpu, clock, (0.3, 0.9), requests=6000)
    for pt in points:
        assert -0.10 <= pt.ttft_error <= 0.15, pt
        assert -0.10 <= pt.tbt_error <= 0.15, pt


def op(margin: float | str = 0.0, clock_frac: float = 1.0, gpu: str = "H100-SXM5-80GB") -> OpSpec:
    cat = builtin_catalog()
    g = cat.gpu(gpu)
    wl = Workload(
        name="w",
        model="Llama-3.1-8B",
        rate_rps=1.0,
        prompt_tokens=TokenDist(mean=1024),
        output_tokens=TokenDist(mean=256),
        slo=Slo(ttft_ms=600, tbt_ms=60, percentile=99),
    )
    opts = Options(latency_margin=margin)  # type: ignore[arg-type]
    return OpSpec(
        g,
        cat.model("Llama-3.1-8B"),
        wl,
        "both",
        clock_frac * g.max_sm_clock_mhz,
        1.0,
        1.0,
        g.memory_gb * 0.9,
        1,
        opts,
    )


def test_latency_margin_is_every_pass_taking_longer() -> None:
    """With margin m the percentiles at rate x are (1 + m) times those at (1 + m) x, and
    the capacity is the capacity at SLO / (1 + m), divided by (1 + m)."""
    plain = build_params([op()])
    margined = build_params([op(0.2)])
    rate = np.asarray([5.0])
    a = metrics_at(margined, rate)
    b = metrics_at(plain, rate * 1.2)
    assert a.ttft_ms[0] == pytest.approx(1.2 * b.ttft_ms[0], rel=1e-9)
    assert a.tbt_ms[0] == pytest.approx(1.2 * b.tbt_ms[0], rel=1e-9)
    assert a.batch[0] == pytest.approx(b.batch[0], rel=1e-9)
    cap = slo_capacity(margined)[0]
    tighter_slo = op().workload.model_copy(
        update={"slo": Slo(ttft_ms=600 / 1.2, tbt_ms=60 / 1.2, percentile=99)}
    )
    tight = build_params([replace(op(), workload=tighter_slo)])
    assert cap == pytest.approx(slo_capacity(tight)[0] / 1.2, rel=1e-6)
    assert cap < 0.8 * slo_capacity(plain)[0]


def test_calibrated_margin_is_the_gpu_types_measured_error() -> None:
    cat = builtin_catalog()
    for gpu in ("A100-SXM4-80GB", "H100-SXM5-80GB"):
        err = cat.gpu(gpu).efficiency.latency_error
        assert 0.05 < err < 0.25
        calibrated = slo_capacity(build_params([op("calibrated", gpu=gpu)]))[0]
        explicit = slo_capacity(build_params([op(err, gpu=gpu)]))[0]
        assert calibrated == pytest.approx(explicit, rel=1e-12)
        assert calibrated < slo_capacity(build_params([op(gpu=gpu)]))[0]


def test_clock_response_comes_from_the_gpu_type() -> None:
    """A catalog entry's clock-fixed shares change pass times below the max clock only."""
    base = op(clock_frac=0.5)
    g = base.gpu
    eff = g.efficiency.model_copy(update={"compute_clock_fixed": 0.6, "overhead_clock_fixed": 0.9})
    faster = replace(base, gpu=g.model_copy(update={"efficiency": eff}))
    top = op(clock_frac=1.0)
    top_fast = replace(top, gpu=faster.gpu)
    batch, ctx = np.asarray([64.0]), np.asarray([1152.0])
    slow_ms = decode_pass(build_params([base]), batch, ctx).ms[0]
    fast_ms = decode_pass(build_params([faster]), batch, ctx).ms[0]
    assert fast_ms < slow_ms
    assert decode_pass(build_params([top]), batch, ctx).ms[0] == pytest.approx(
        decode_pass(build_params([top_fast]), batch, ctx).ms[0], rel=1e-12
    )


@pytest.mark.parametrize("bad", [-0.1, "sometimes", 11.0])
def test_bad_margins_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="latency_margin"):
        Options(latency_margin=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency_margin"):
        PlannerSpec(name="p", kind="energyopt", latency_margin=bad)  # type: ignore[arg-type]


def test_pooled_runs_and_the_percentile_interval() -> None:
    """Pooling replicate runs adds their counters; the 95 % order-statistic interval
    of a percentile holds the sample percentile and narrows as samples are pooled."""
    from energyopt.sim.metrics import WorkloadStats

    slo = Slo(ttft_ms=100.0, tbt_ms=10.0, percentile=99)
    rng = np.random.default_rng(0)

    def run(n: int) -> WorkloadStats:
        st = WorkloadStats("w", slo)
        for x in rng.exponential(20.0, n):
            st.arrived += 1
            st.first_token(float(x))
            st.gaps(float(x) / 10.0, 3)
        return st

    a, b = run(2000), run(2000)
    lo_a, hi_a = a.ttft_percentile_interval_ms(0.99)
    assert lo_a <= a.ttft_percentile_ms(0.99) <= hi_a
    ok, gaps = a.ttft_ok + b.ttft_ok, a.tbt_gaps + b.tbt_gaps
    a.absorb(b)
    assert (a.arrived, a.ttft_ok, a.tbt_gaps, len(a.ttft_ms)) == (4000, ok, gaps, 4000)
    assert sum(a.tbt_hist) == gaps
    lo, hi = a.ttft_percentile_interval_ms(0.99)
    assert lo <= a.ttft_percentile_ms(0.99) <= hi
    assert hi - lo < hi_a - lo_a
    # the exponential's true P99 (20 ln 100 = 92.1 ms) lies inside
    assert lo < 20.0 * np.log(100.0) < hi
    with pytest.raises(ValueError, match="cannot pool"):
        a.absorb(WorkloadStats("other", slo))
    assert all(np.isnan(WorkloadStats("w", slo).ttft_percentile_interval_ms(0.99)))
