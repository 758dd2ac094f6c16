"""Loads for the simulator: trace replay and scaling, synthetic rates, forecasts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from energyopt.sim.arrivals import Arrivals
from energyopt.sim.forecast import planned_rates_rps, raw_rates_rps
from energyopt.sim.synthetic import synthetic_arrivals, token_counts
from energyopt.sim.trace import read_trace, superpose, trace_arrivals
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import BurstyLoad, DiurnalLoad, Forecast
from energyopt.spec.workload import Slo, TokenDist, Workload


def workloads(*rates: float) -> tuple[Workload, ...]:
    return tuple(
        Workload(
            name=f"w{i}",
            model="Llama-3.1-8B",
            rate_rps=r,
            prompt_tokens=TokenDist(mean=400),
            output_tokens=TokenDist(mean=100),
            slo=Slo(ttft_ms=500, tbt_ms=50),
        )
        for i, r in enumerate(rates)
    )


def test_superposition_scales_the_rate_and_keeps_times_in_the_window() -> None:
    rng = np.random.default_rng(0)
    t = np.sort(rng.random(2000) * 100.0)
    times, rows = superpose(t, 100.0, 2.5, rng)
    assert abs(len(times) / 2000 - 2.5) < 0.1
    assert np.all(np.diff(times) >= 0)
    assert times.min() >= 0 and times.max() < 100.0
    assert rows.min() >= 0 and rows.max() < 2000


def test_trace_replay_rate_assignment_and_tokens(shared_data: Path) -> None:
    path = shared_data / "traces" / "azure-llm-2023-conv.csv"
    wl = workloads(6.0, 2.0)
    arr = trace_arrivals(
        path, wl, start_s=0.0, duration_s=600.0, load_scale=1.5, tokens="trace", seed=1
    )
    rate = len(arr) / 600.0
    assert rate == pytest.approx(1.5 * 8.0, rel=0.05)
    share = np.mean(arr.workload == 0)
    assert share == pytest.approx(0.75, abs=0.03)
    _, prompt, output = read_trace(path)
    assert set(arr.prompt_tokens.tolist()) <= set(prompt.tolist())
    assert set(arr.output_tokens.tolist()) <= set(output.tolist())
    scaled = trace_arrivals(
        path, wl, start_s=0.0, duration_s=600.0, load_scale=1.5, tokens="scaled", seed=1
    )
    p, o = scaled.mean_tokens()
    assert p == pytest.approx([400, 400], rel=0.01)
    assert o == pytest.approx([100, 100], rel=0.02)


def test_bad_trace_is_a_spec_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(SpecError, match="missing column"):
        read_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n")
    with pytest.raises(SpecError, match="line 2"):
        read_trace(bad)


def test_diurnal_and_bursty_keep_the_mean_rate() -> None:
    wl = workloads(20.0)
    day = synthetic_arrivals(DiurnalLoad(kind="diurnal", load_scale=0.5), wl, 2000.0, 3)
    assert len(day) / 2000.0 == pytest.approx(10.0, rel=0.05)
    rates = day.window_rates_rps(0.0, 2000.0, 250.0)[:, 0]
    assert rates[0] < rates[3] and rates[-1] < rates[4]  # trough, peak, trough
    burst = synthetic_arrivals(
        BurstyLoad(kind="bursty", burst_factor=4.0, burst_s=10.0, gap_s=40.0), wl, 4000.0, 4
    )
    assert len(burst) / 4000.0 == pytest.approx(20.0, rel=0.1)
    per_window = burst.window_rates_rps(0.0, 4000.0, 5.0)[:, 0]
    assert per_window.max() > 2.5 * np.median(per_window)


def test_token_counts_have_the_mean_and_respect_max() -> None:
    rng = np.random.default_rng(0)
    counts = token_counts(TokenDist(mean=300), 0.6, 20000, rng)
    assert counts.mean() == pytest.approx(300, rel=0.03)
    capped = token_counts(TokenDist(mean=300, max=400), 0.6, 2000, rng)
    assert capped.max() <= 400 and capped.min() >= 1
    assert set(token_counts(TokenDist(mean=300), 0.0, 5, rng).tolist()) == {300}


def test_forecasts_look_back_except_the_oracle() -> None:
    t = np.concatenate([np.linspace(0, 99.9, 100), np.linspace(100, 199.99, 1000)])
    arr = Arrivals(
        t,
        np.zeros(t.size, dtype=np.int64),
        np.ones(t.size, dtype=np.int64),
        np.ones(t.size, dtype=np.int64),
        ("w",),
    )
    last = Forecast(method="last", window_s=10.0)
    peak = Forecast(method="peak", window_s=10.0)
    oracle = Forecast(method="oracle", window_s=10.0)
    assert raw_rates_rps(arr, 100.0, 100.0, last, 200.0)[0] == pytest.approx(1.0)
    assert raw_rates_rps(arr, 100.0, 100.0, oracle, 200.0)[0] == pytest.approx(10.0, rel=0.02)
    assert raw_rates_rps(arr, 200.0, 100.0, peak, 200.0)[0] == pytest.approx(10.0, rel=0.02)
    base = np.asarray([4.0])
    fc = Forecast(headroom=1.1, quantum=0.25, floor=0.1)
    assert planned_rates_rps(np.asarray([2.0]), base, fc)[0] == pytest.approx(3.0)
    assert planned_rates_rps(np.asarray([0.0]), base, fc)[0] == pytest.approx(1.0)


def test_trend_forecast_meets_a_rising_load() -> None:
    # rate(t) = 1 + 0.05 t req/s: arrivals where N(t) = t + 0.025 t^2 crosses integers
    counts = np.arange(1, int(200 + 0.025 * 200**2))
    t = (-1 + np.sqrt(1 + 0.1 * counts)) / 0.05
    arr = Arrivals(
        t,
        np.zeros(t.size, dtype=np.int64),
        np.ones(t.size, dtype=np.int64),
        np.ones(t.size, dtype=np.int64),
        ("w",),
    )
    peak = raw_rates_rps(arr, 100.0, 100.0, Forecast(method="peak", window_s=10.0), 200.0)[0]
    trend = raw_rates_rps(arr, 100.0, 100.0, Forecast(method="trend", window_s=10.0), 200.0)[0]
    assert peak == pytest.approx(1 + 0.05 * 95, rel=0.05)
    assert trend == pytest.approx(1 + 0.05 * 200, rel=0.05)


def test_arrivals_before_keeps_exactly_the_earlier_requests() -> None:
    t = np.array([0.5, 1.0, 1.0, 2.5, 3.0])
    arr = Arrivals(
        time_s=t,
        workload=np.zeros(5, dtype=np.int64),
        prompt_tokens=np.arange(1, 6, dtype=np.int64),
        output_tokens=np.arange(6, 11, dtype=np.int64),
        names=("w",),
    )
    cut = arr.before(2.5)
    assert list(cut.time_s) == [0.5, 1.0, 1.0]
    assert list(cut.prompt_tokens) == [1, 2, 3] and list(cut.output_tokens) == [6, 7, 8]
    assert len(arr.before(0.5)) == 0 and len(arr.before(10.0)) == 5
