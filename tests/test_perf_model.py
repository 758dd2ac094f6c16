"""Properties of the performance model that every formulation relies on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from energyopt.catalog import builtin_catalog
from energyopt.perf.energy import energy_per_request_j, line_and_worst_case, steady_power_w
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import metrics_at, slo_capacity
from energyopt.spec import Options, Slo, TokenDist, Workload

GPUS = ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L40S", "L4"]
MODELS = ["Llama-3.1-8B", "Mistral-7B", "Qwen2.5-14B"]

cases = st.fixed_dictionaries(
    {
        "gpu": st.sampled_from(GPUS),
        "model": st.sampled_from(MODELS),
        "prompt": st.integers(64, 4096),
        "output": st.integers(16, 1024),
        "ttft": st.floats(100, 5000),
        "tbt": st.floats(20, 200),
        "pct": st.sampled_from([50.0, 90.0, 99.0]),
        "phase": st.sampled_from(["both", "prefill", "decode"]),
        "clock_frac": st.floats(0.3, 1.0),
        "share": st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    }
)


def spec(
    case: dict,
    clock_frac: float | None = None,
    share: float | None = None,
    ttft: float | None = None,
    tbt: float | None = None,
) -> OpSpec:
    cat = builtin_catalog()
    gpu = cat.gpu(case["gpu"])
    model = cat.model(case["model"])
    wl = Workload(
        name="w",
        model=model.name,
        rate_rps=1.0,
        prompt_tokens=TokenDist(mean=case["prompt"]),
        output_tokens=TokenDist(mean=case["output"]),
        slo=Slo(ttft_ms=ttft or case["ttft"], tbt_ms=tbt or case["tbt"], percentile=case["pct"]),
    )
    frac = share if share is not None else case["share"]
    clock = (clock_frac if clock_frac is not None else case["clock_frac"]) * gpu.max_sm_clock_mhz
    return OpSpec(
        gpu, model, wl, case["phase"], clock, frac, frac, gpu.memory_gb * 0.9, 1, Options()
    )


H100_LLAMA = {
    "gpu": "H100-SXM5-80GB",
    "model": "Llama-3.1-8B",
    "prompt": 1024,
    "output": 256,
    "ttft": 1000.0,
    "tbt": 100.0,
    "pct": 90.0,
    "phase": "both",
    "clock_frac": 1.0,
    "share": 1.0,
}


def lower_clock(case: dict) -> float:
    return case["clock_frac"] * 0.8


@settings(max_examples=30, deadline=None)
@given(cases)
def test_latency_never_falls_when_clock_or_share_falls(case: dict) -> None:
    base = build_params([spec(case)])
    slower = build_params([spec(case, clock_frac=lower_clock(case))])
    smaller = build_params([spec(case, share=case["share"] / 2)])
    tokens = np.asarray([float(case["prompt"])])
    for p in (slower, smaller):
        assert prefill_pass(p, tokens).ms[0] >= prefill_pass(base, tokens).ms[0] * (1 - 1e-12)
        for batch in (1.0, 16.0, 128.0):
            b = np.asarray([batch])
            assert decode_pass(p, b, tokens).ms[0] >= decode_pass(base, b, tokens).ms[0] * (
                1 - 1e-12
            )


@settings(max_examples=20, deadline=None)
@given(cases)
def test_slo_capacity_is_monotone_in_clock_share_and_slo(case: dict) -> None:
    specs = [
        spec(case),
        spec(case, clock_frac=lower_clock(case)),
        spec(case, share=case["share"] / 2),
        spec(case, ttft=case["ttft"] * 1.5, tbt=case["tbt"] * 1.5),
    ]
    cap = slo_capacity(build_params(specs))
    base, slower_clock, smaller_share, looser_slo = cap
    tol = 1e-6 * max(base, 1e-9)
    assert slower_clock <= base + tol
    assert smaller_share <= base + tol
    assert looser_slo >= base - tol


@settings(max_examples=20, deadline=None)
@given(cases, st.floats(0.05, 0.95))
def test_rates_below_capacity_meet_the_slo(case: dict, fraction: float) -> None:
    p = build_params([spec(case)])
    cap = slo_capacity(p)
    if cap[0] <= 0:
        return
    met = metrics_at(p, cap * fraction)
    assert met.meets_slo(p)[0]
    assert not metrics_at(p, cap * 1.01).meets_slo(p)[0]
    at_cap = metrics_at(p, cap)
    assert met.memory_bytes[0] <= at_cap.memory_bytes[0]
    assert met.ttft_ms[0] <= at_cap.ttft_ms[0] and met.tbt_ms[0] <= at_cap.tbt_ms[0]


@settings(max_examples=20, deadline=None)
@given(cases, st.floats(0.02, 0.95), st.floats(1.05, 3.0))
def test_power_is_monotone_in_clock_and_covered_in_rate(
    case: dict, load: float, more: float
) -> None:
    """At one rate a lower clock never draws more (on-power + steady dynamic power):
    the direction every clock decision relies on. Along the rate the draw need not
    rise (at a low clock a larger decode batch turns a step compute-bound and the
    draw can fall), so what caps and routing rely on is checked instead: the worst
    case a cap holds is at least the draw at every rate up to capacity, and the
    power line never charges a negative price per request."""
    hi = build_params([spec(case)])
    lo = build_params([spec(case, clock_frac=lower_clock(case))])
    cap = float(slo_capacity(lo)[0])
    assume(cap > 1e-6)
    rate = np.asarray([load * cap])
    gpu = builtin_catalog().gpu(case["gpu"])
    f_hi = case["clock_frac"] * gpu.max_sm_clock_mhz
    f_lo = lower_clock(case) * gpu.max_sm_clock_mhz
    power_hi = gpu_on_power_w(gpu, f_hi) + steady_power_w(hi, rate)[0]
    power_lo = gpu_on_power_w(gpu, f_lo) + steady_power_w(lo, rate)[0]
    assert power_lo <= power_hi * (1 + 1e-6)
    more_rate = np.asarray([min(load * more, 0.99) * cap])
    line, worst = line_and_worst_case(lo, np.asarray([cap]), np.asarray([cap]))
    for r in (rate, more_rate):
        assert worst[0] >= steady_power_w(lo, r)[0] * (1 - 1e-6)
    assert line.marginal_j[0] >= 0 and line.fixed_w[0] >= 0
    assert steady_power_w(hi, rate)[0] > 0


def test_worst_case_covers_a_draw_that_falls_before_capacity() -> None:
    """A decode placement at 30 % of the max clock: its draw peaks well below
    capacity and then falls (a compute-bound step spreads the weight streaming over
    more time); the worst case a cap holds is above the draw at every rate."""
    case = {
        "gpu": "H200-SXM-141GB",
        "model": "Qwen2.5-14B",
        "prompt": 822,
        "output": 400,
        "ttft": 4841.0,
        "tbt": 192.4,
        "pct": 99.0,
        "phase": "decode",
        "clock_frac": 0.3063,
        "share": 0.5,
    }
    p = build_params([spec(case)])
    cap = float(slo_capacity(p)[0])
    fractions = np.linspace(0.01, 1.0, 100)
    curve = steady_power_w(build_params([spec(case)] * len(fractions)), fractions * cap)
    assert curve.max() > 1.05 * curve[-1]  # the draw falls before capacity
    _, worst = line_and_worst_case(p, np.asarray([cap]), np.asarray([cap]))
    assert worst[0] >= curve.max()


def test_memory_bound_decode_barely_moves_with_clock() -> None:
    """Published behaviour: decode is largely insensitive to the SM clock."""
    case = {**H100_LLAMA, "phase": "decode"}
    fast = build_params([spec(case)])
    slow = build_params([spec(case, clock_frac=0.6)])
    b, ctx = np.asarray([8.0]), np.asarray([1024.0])
    ratio = decode_pass(slow, b, ctx).ms[0] / decode_pass(fast, b, ctx).ms[0]
    assert 1.0 <= ratio < 1.35
    pre_ratio = prefill_pass(slow, ctx).ms[0] / prefill_pass(fast, ctx).ms[0]
    assert pre_ratio > 1.4  # compute-bound prefill scales close to 1/f
    energy_ratio = decode_pass(slow, b, ctx).energy_j[0] / decode_pass(fast, b, ctx).energy_j[0]
    assert energy_ratio < 0.8  # a lower clock saves decode energy


def test_energy_per_token_follows_energy_per_request() -> None:
    from energyopt.perf.energy import energy_per_output_token_j

    case = {**H100_LLAMA, "phase": "both"}
    p = build_params([spec(case)])
    per_request = energy_per_request_j(p)[0]
    assert energy_per_output_token_j(p)[0] == pytest.approx(per_request / 256)
