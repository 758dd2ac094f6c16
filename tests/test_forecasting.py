"""Forecast methods holt, seasonal, quantile and auto (sim/forecast.py, docs/forecasting.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from energyopt.sim.arrivals import Arrivals
from energyopt.sim.forecast import (
    auto_choice,
    auto_scores,
    capacity_need,
    expected_rates_rps,
    raw_rates_rps,
    smoothed_forecast,
)
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import Forecast, load_evaluation

from .test_sim_evaluate import BASE


def arrivals_at(rates: list[list[float]], window_s: float) -> Arrivals:
    """Deterministic arrivals: in window i, rates[i][k] x window_s requests of
    workload k, evenly spaced inside the window (so every window rate is exact)."""
    parts_t: list[np.ndarray] = []
    parts_w: list[np.ndarray] = []
    for i, row in enumerate(rates):
        for k, rate in enumerate(row):
            n = round(rate * window_s)
            parts_t.append(i * window_s + (np.arange(n) + 0.5) * window_s / max(n, 1))
            parts_w.append(np.full(n, k, dtype=np.int64))
    t = np.concatenate(parts_t)
    w = np.concatenate(parts_w)
    order = np.argsort(t, kind="stable")
    ones = np.ones(t.size, dtype=np.int64)
    names = tuple(f"w{k}" for k in range(len(rates[0])))
    return Arrivals(t[order], w[order], ones, ones, names)


def test_window_rates_count_every_request_once() -> None:
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(0, 100, 500))
    w = rng.integers(0, 3, 500)
    ones = np.ones(500, dtype=np.int64)
    arr = Arrivals(t, w, ones, ones, ("a", "b", "c"))
    rates = arr.window_rates_rps(5.0, 95.0, 7.0)
    edges = np.append(np.arange(5.0, 95.0, 7.0), 95.0)
    for i in range(len(edges) - 1):
        inside = (t >= edges[i]) & (t < edges[i + 1])
        want = np.bincount(w[inside], minlength=3) / (edges[i + 1] - edges[i])
        assert rates[i] == pytest.approx(want)


def test_holt_on_a_constant_series_returns_the_constant() -> None:
    y = np.tile([[3.0, 0.5, 12.0]], (17, 1))
    ahead, residual = smoothed_forecast(y, 6)
    assert ahead == pytest.approx(np.tile(y[0], (6, 1)))
    assert np.nanmax(np.abs(residual)) == pytest.approx(0.0)
    arr = arrivals_at([[4.0, 2.0]] * 20, 10.0)
    for fc in (Forecast(method="holt", window_s=10.0), Forecast(method="quantile", window_s=10.0)):
        assert raw_rates_rps(arr, 100.0, 50.0, fc, 200.0) == pytest.approx([4.0, 2.0])
        assert expected_rates_rps(arr, 100.0, 50.0, fc, 200.0) == pytest.approx([4.0, 2.0])


def test_damped_holt_on_a_ramp_rises_but_stays_under_the_straight_line() -> None:
    y = (1.0 + 2.0 * np.arange(30.0))[:, None]
    ahead, _ = smoothed_forecast(y, 5)
    line = y[-1, 0] + 2.0 * np.arange(1, 6)
    assert np.all(np.diff(ahead[:, 0]) > 0) and ahead[0, 0] > y[-1, 0]
    assert np.all(ahead[:, 0] <= line + 1e-9)


def test_seasonal_recovers_a_sine_after_two_seasons() -> None:
    m = 12
    t = np.arange(3 * m)
    y = np.stack([10 + 5 * np.sin(2 * np.pi * t / m), 4 + np.cos(2 * np.pi * t / m)], axis=1)
    ahead, _ = smoothed_forecast(y[: 2 * m], m, season=m)
    assert ahead == pytest.approx(y[2 * m :], abs=1e-6)
    noisy = y + np.random.default_rng(3).normal(0, 0.1, y.shape)
    ahead, _ = smoothed_forecast(noisy[: 2 * m], m, season=m)
    assert np.max(np.abs(ahead - y[2 * m :])) < 0.6
    plain, _ = smoothed_forecast(y[: 2 * m], m)
    assert np.max(np.abs(plain - y[2 * m :])) > 2.0  # holt alone misses the season


def test_seasonal_with_less_than_a_season_is_holt() -> None:
    y = np.random.default_rng(0).uniform(1, 5, (7, 2))
    seasonal = smoothed_forecast(y, 4, season=8)
    holt = smoothed_forecast(y, 4)
    assert seasonal[0] == pytest.approx(holt[0])
    arr = arrivals_at(y.tolist(), 10.0)
    s = Forecast(method="seasonal", window_s=10.0, season_s=80.0)
    h = Forecast(method="holt", window_s=10.0)
    assert raw_rates_rps(arr, 70.0, 30.0, s, 100.0) == pytest.approx(
        raw_rates_rps(arr, 70.0, 30.0, h, 100.0)
    )


def test_quantile_lies_within_the_history_and_grows_with_q() -> None:
    rng = np.random.default_rng(5)
    rows = rng.uniform(0.5, 9.0, (30, 3)).round(1)
    arr = arrivals_at(rows.tolist(), 10.0)
    rates = arr.window_rates_rps(100.0, 250.0, 10.0)
    before = np.full(3, -np.inf)
    for q in (0.05, 0.3, 0.5, 0.9, 1.0):
        fc = Forecast(method="quantile", quantile=q, window_s=10.0, history_s=150.0)
        got = raw_rates_rps(arr, 250.0, 60.0, fc, 300.0)
        assert np.all(got >= rates.min(axis=0) - 1e-9) and np.all(got <= rates.max(axis=0) + 1e-9)
        assert np.all(got >= before - 1e-9)
        before = got
    peak = Forecast(method="peak", window_s=10.0, history_s=150.0)
    assert before == pytest.approx(raw_rates_rps(arr, 250.0, 60.0, peak, 300.0))


def test_capacity_need_ignores_a_constant_scale() -> None:
    rng = np.random.default_rng(2)
    means = rng.uniform(1, 3, (9, 2))
    peaks = means * rng.uniform(1.1, 2.0, (9, 2))
    fcst = rng.uniform(1, 4, (9, 2))
    need, score = capacity_need(peaks, means, fcst, 0.9)
    need3, score3 = capacity_need(peaks, means, 3 * fcst, 0.9)
    assert score3 == pytest.approx(score) and need3 == pytest.approx(need / 3)
    _, worse = capacity_need(peaks, means, fcst * rng.uniform(0.5, 2.0, (9, 2)), 0.9)
    exact = capacity_need(peaks, means, peaks, 0.9)
    assert np.all(exact[1] <= worse + 1e-12) and exact[0] == pytest.approx([1.0, 1.0])


def test_auto_never_looks_ahead() -> None:
    rng = np.random.default_rng(7)
    rows = rng.uniform(1, 6, (40, 2)).round(1).tolist()
    other = rows[:20] + rng.uniform(10, 30, (20, 2)).round(1).tolist()
    a, b = arrivals_at(rows, 10.0), arrivals_at(other, 10.0)
    fc = Forecast(method="auto", window_s=10.0, season_s=60.0)
    for now in (30.0, 120.0, 200.0):
        assert raw_rates_rps(a, now, 30.0, fc, 400.0) == pytest.approx(
            raw_rates_rps(b, now, 30.0, fc, 400.0)
        )
        assert expected_rates_rps(a, now, 30.0, fc, 400.0) == pytest.approx(
            expected_rates_rps(b, now, 30.0, fc, 400.0)
        )
        assert list(auto_choice(a, now, 30.0, fc)[1]) == list(auto_choice(b, now, 30.0, fc)[1])
    assert raw_rates_rps(a, 250.0, 30.0, fc, 400.0) != pytest.approx(
        raw_rates_rps(b, 250.0, 30.0, fc, 400.0)
    )


def test_auto_without_history_is_trend() -> None:
    rows = np.random.default_rng(9).uniform(1, 6, (20, 2)).round(1).tolist()
    arr = arrivals_at(rows, 10.0)
    auto = Forecast(method="auto", window_s=10.0)
    trend = Forecast(method="trend", window_s=10.0)
    for now in (0.0, 40.0):
        assert raw_rates_rps(arr, now, 50.0, auto, 200.0) == pytest.approx(
            raw_rates_rps(arr, now, 50.0, trend, 200.0)
        )
        assert expected_rates_rps(arr, now, 50.0, auto, 200.0) == pytest.approx(
            expected_rates_rps(arr, now, 50.0, trend, 200.0)
        )


def test_auto_picks_the_method_that_is_exact() -> None:
    # a season of 8 windows; 30-s epochs of 3 windows see different parts of it,
    # so only the seasonal model forecasts every epoch's peak exactly
    pattern = [2.0, 3.0, 6.0, 11.0, 9.0, 4.0, 2.5, 1.5]
    rows = [[r, 2 * r] for r in pattern * 8]
    arr = arrivals_at(rows, 10.0)
    fc = Forecast(method="auto", window_s=10.0, season_s=80.0)
    methods, needs, scores = auto_scores(arr, 600.0, 30.0, fc)
    names, pick = auto_choice(arr, 600.0, 30.0, fc)
    assert [names[i] for i in pick] == ["seasonal", "seasonal"]
    at = methods.index("seasonal")
    assert np.all(scores[at] < np.delete(scores, at, axis=0).min(axis=0))
    came = arr.window_rates_rps(600.0, 630.0, 10.0).max(axis=0)
    seasonal = fc.model_copy(update={"method": "seasonal"})
    assert raw_rates_rps(arr, 600.0, 30.0, seasonal, 640.0) == pytest.approx(came, rel=1e-6)
    expected = raw_rates_rps(arr, 600.0, 30.0, seasonal, 640.0) * needs[at]
    assert raw_rates_rps(arr, 600.0, 30.0, fc, 640.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"method": "seasonal"}, "season_s"),
        ({"season_s": 0.0}, "season_s"),
        ({"season_s": 50.0, "window_s": 30.0}, "season_s"),
        ({"quantile": 0.0}, "quantile"),
        ({"quantile": 1.5}, "quantile"),
        ({"error_quantile": 1.0}, "error_quantile"),
        ({"method": "arima"}, "method"),
    ],
)
def test_bad_forecast_fields_are_named(fields: dict[str, object], name: str) -> None:
    with pytest.raises(ValidationError, match=name):
        Forecast.model_validate(fields)


def write_eval(tmp_path: Path, forecast: dict[str, object]) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**BASE, "name": "fc-tiny"}))
    spec = {
        "kind": "evaluate",
        "name": "tiny",
        "base": "base.yaml",
        "load": {"kind": "diurnal", "amplitude": 0.5, "period_s": 60},
        "duration_s": 90,
        "epoch_s": 30,
        "forecast": forecast,
        "planners": [{"name": "performance-first", "kind": "performance-first"}],
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_spec_file_with_a_bad_season_names_the_file_and_field(tmp_path: Path) -> None:
    path = write_eval(tmp_path, {"method": "seasonal", "season_s": -5})
    with pytest.raises(SpecError) as info:
        load_evaluation(path)
    assert "eval.yaml" in str(info.value) and "season_s" in str(info.value)


def test_auto_stays_finite_when_every_method_missed_a_new_workload() -> None:
    # workload 1 starts at 90 s: every forecast made at 90 s for it was 0
    rows = [[3.0, 0.0]] * 9 + [[3.0, 5.0]] * 6
    arr = arrivals_at(rows, 10.0)
    auto = Forecast(method="auto", window_s=10.0)
    trend = Forecast(method="trend", window_s=10.0)
    _, _, scores = auto_scores(arr, 120.0, 30.0, auto)
    assert np.all(np.isinf(scores[:, 1])) and np.all(np.isfinite(scores[:, 0]))
    got = raw_rates_rps(arr, 120.0, 30.0, auto, 150.0)
    assert np.all(np.isfinite(got))
    assert got[1] == pytest.approx(raw_rates_rps(arr, 120.0, 30.0, trend, 150.0)[1])
