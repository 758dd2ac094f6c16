"""The clairvoyant yardstick (a plan per 30-s window at the window's true rates,
replayed) and the model's power of a plan at the rates that arrived."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from energyopt.catalog.problem import load_problem
from energyopt.cli import main
from energyopt.families.serving.loop import (
    CLAIRVOYANT_WINDOW_S,
    EvaluationResult,
    build_arrivals,
    clairvoyant_evaluation,
    plan_lead_s,
    plan_power_at_rates_w,
    planning_problem,
    run_clairvoyant,
    run_covering_clairvoyant,
)
from energyopt.families.serving.remap import plan_rates_rps, problem_at_plan_rates
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan
from energyopt.solvers.presets import load_preset
from energyopt.spec.evaluation import PlannerSpec, load_evaluation

BASE = {
    "name": "yardstick-tiny",
    "cluster": {"nodes": [{"name": "n0", "gpus": [{"type": "H100-SXM5-80GB", "count": 2}]}]},
    "workloads": [
        {
            "name": "chat",
            "model": "Llama-3.1-8B",
            "rate_rps": 6.0,
            "prompt_tokens": {"mean": 512},
            "output_tokens": {"mean": 128},
            "slo": {"ttft_ms": 500, "tbt_ms": 60},
        },
        {
            "name": "code",
            "model": "Llama-3.1-8B",
            "rate_rps": 3.0,
            "prompt_tokens": {"mean": 1024},
            "output_tokens": {"mean": 256},
            "slo": {"ttft_ms": 800, "tbt_ms": 60},
        },
    ],
    "options": {"clocks_mhz": {"H100-SXM5-80GB": [990, 1410, 1980]}},
}


EXACT = PlannerSpec(name="clairvoyant", kind="energyopt", solver="highs-per-gpu")
"""The yardstick's planner with the exact preset that is quickest on two GPUs."""


def _result(tmp_path: Path, duration_s: float) -> EvaluationResult:
    """A bursty load on the tiny fleet, with no planner run yet."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    spec = {
        "kind": "evaluate",
        "name": "tiny",
        "base": "base.yaml",
        "load": {"kind": "bursty", "burst_factor": 3.0, "burst_s": 20, "gap_s": 30},
        "duration_s": duration_s,
        "epoch_s": 300,
        "planners": [{"name": "performance-first", "kind": "performance-first"}],
        "seed": 4,
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(spec))
    ev = load_evaluation(path)
    problem = load_problem(tmp_path / "base.yaml")
    arrivals = build_arrivals(ev, problem, path)
    return EvaluationResult(ev, planning_problem(problem, arrivals), arrivals, [], [], [])


def test_the_yardstick_plans_every_window_at_its_true_rates_and_its_plans_verify(
    tmp_path: Path,
) -> None:
    res = _result(tmp_path, 60.0)
    windows = math.ceil(60.0 / CLAIRVOYANT_WINDOW_S)
    run = run_clairvoyant(res, EXACT)
    true = res.arrivals.window_rates_rps(0.0, 60.0, CLAIRVOYANT_WINDOW_S)
    assert true.shape[0] == windows
    assert (true > 0).all()  # every workload has requests in every window
    # one plan per window, for the rates that arrive in it (not the forecast's
    # trend, headroom or quantum)
    planned = np.asarray(run.tally.planned_rps)
    assert planned.shape == true.shape
    base = np.asarray([w.rate_rps for w in res.problem.instance.workloads])
    assert np.all(planned >= true - 1e-9)
    assert np.all(planned <= true + 1e-6 * base + 1e-9)
    # the bursts make the windows differ: a forecast would not have matched them all
    assert np.ptp(true.sum(axis=1)) > 0.1 * true.sum(axis=1).mean()
    assert run.tally.rejected_plans == 0
    assert run.tally.shortfall_epochs == 0 and run.tally.unplanned_epochs == 0
    # with no forecast error, the plans' predicted energy is the model's energy at
    # the arrivals
    assert run.tally.predicted_arrivals_j == pytest.approx(run.tally.predicted_j, rel=1e-6)
    # replayed in the simulator: every request served, the fleet's energy metered
    assert run.result.arrived == len(res.arrivals)
    assert run.result.completed == run.result.arrived
    assert run.result.energy_j > 0


def test_a_plan_made_with_a_latency_margin_is_priced_at_the_arrivals_on_its_own_model(
    tmp_path: Path,
) -> None:
    # a margin lowers every op's capacity and so moves its power line; the plans'
    # power at the arrivals must be priced on the model they were planned on, or a
    # plan with no forecast error would show one
    res = _result(tmp_path, 30.0)
    spec = EXACT.model_copy(update={"name": "margin", "latency_margin": 0.3})
    run = run_clairvoyant(res, spec)
    assert run.tally.rejected_plans == 0
    assert run.tally.predicted_arrivals_j == pytest.approx(run.tally.predicted_j, rel=1e-6)


def test_the_yardstick_replans_with_no_headroom_every_window() -> None:
    spec = Path(__file__).resolve().parents[1] / "instances/evaluate/quickstart-bursty.yaml"
    ev = load_evaluation(spec)
    yard = clairvoyant_evaluation(ev, 15.0)
    assert yard.epoch_s == 15.0
    assert yard.forecast.method == "oracle"
    assert yard.forecast.window_s == 15.0
    assert yard.forecast.headroom == 1.0
    assert (yard.load, yard.duration_s, yard.seed) == (ev.load, ev.duration_s, ev.seed)


def test_the_yardstick_refuses_a_baseline_planner(tmp_path: Path) -> None:
    res = _result(tmp_path, 30.0)
    with pytest.raises(ValueError, match="energyopt planner"):
        run_clairvoyant(res, PlannerSpec(name="pf", kind="performance-first"))


def test_a_plan_at_the_arrivals_is_priced_on_its_own_power_lines(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    problem = load_problem(tmp_path / "base.yaml")
    result = solve(problem, load_preset("highs-per-gpu"), time_limit_s=60)
    assert result.plan is not None
    plan = result.plan
    at = problem_at_plan_rates(problem, plan)
    rates = plan_rates_rps(plan)
    own = evaluate_plan(at, plan)
    # at its planned rates: what the verifier (and so the solver) says the plan draws
    assert plan_power_at_rates_w(at, plan, rates) == pytest.approx(own.total_power_w, rel=1e-9)
    assert own.total_power_w == pytest.approx(
        sum(gp.predicted_power_w for gp in plan.gpus), rel=1e-6
    )
    # no arrivals: the GPUs that are on, idle at their clocks
    idle = plan_power_at_rates_w(at, plan, {name: 0.0 for name in rates})
    assert idle == pytest.approx(own.static_power_w, rel=1e-9)
    # more arrivals cost more, fewer cost less, and the fixed part stays while any
    # request arrives: half the rate draws more than half the dynamic power
    half = plan_power_at_rates_w(at, plan, {n: 0.5 * r for n, r in rates.items()})
    more = plan_power_at_rates_w(at, plan, {n: 1.5 * r for n, r in rates.items()})
    assert idle < half < own.total_power_w < more
    assert half - idle > 0.5 * (own.total_power_w - idle)


def _spec(tmp_path: Path, planners: list[dict[str, str]]) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    spec = {
        "kind": "evaluate",
        "name": "tiny",
        "base": "base.yaml",
        "load": {"kind": "diurnal", "amplitude": 0.5},
        "duration_s": 30,
        "planners": planners,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_evaluate_yardstick_adds_the_clairvoyant_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(tmp_path, [{"name": "performance-first", "kind": "performance-first"}])
    assert main(["evaluate", str(path), "-q", "--no-plots", "--yardstick"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("clairvoyant ") for line in out.splitlines())
    with (tmp_path / "out" / "summary.csv").open() as fh:
        rows = {r["planner"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"performance-first", "clairvoyant"}
    yard = rows["clairvoyant"]
    assert int(yard["rejected_plans"]) == 0
    assert int(yard["arrived"]) == int(rows["performance-first"]["arrived"]) > 0
    # priced against the reference like every planner
    assert float(yard["saving"]) == pytest.approx(
        1 - float(yard["energy_j"]) / float(rows["performance-first"]["energy_j"])
    )


def test_evaluate_yardstick_refuses_a_planner_of_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(
        tmp_path,
        [
            {"name": "performance-first", "kind": "performance-first"},
            {"name": "clairvoyant", "kind": "energyopt"},
        ],
    )
    assert main(["evaluate", str(path), "-q", "--no-plots", "--yardstick"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "planners" in err and "clairvoyant" in err


def test_expected_load_is_the_mean_not_the_capacity_forecast() -> None:
    """A plan is sized on a capacity forecast (the history's peak window, or its
    trend at the epoch's end) and its expected draw priced at the mean: on a load
    rising linearly from 2 to 6 req/s the mean forecast for the next epoch is its
    middle's rate, below the capacity forecast."""
    from energyopt.sim.arrivals import Arrivals
    from energyopt.sim.forecast import expected_rates_rps, raw_rates_rps
    from energyopt.spec.evaluation import Forecast

    rng = np.random.default_rng(3)
    # inhomogeneous Poisson arrivals with rate 2 + t / 100 req/s over 400 s
    grid = np.sort(rng.uniform(0.0, 400.0, 40_000))
    keep = rng.uniform(0.0, 1.0, grid.size) < (2.0 + grid / 100.0) / 100.0  # of 100 req/s
    times = grid[keep]
    n = times.size
    ones = np.ones(n, dtype=np.int64)
    arrivals = Arrivals(times, np.zeros(n, dtype=np.int64), ones, ones, ("w",))
    trend = Forecast(method="trend", window_s=10.0, history_s=200.0)
    expected = expected_rates_rps(arrivals, 200.0, 100.0, trend, 400.0)[0]
    capacity = raw_rates_rps(arrivals, 200.0, 100.0, trend, 400.0)[0]
    assert expected == pytest.approx(4.5, rel=0.08)  # the rate at t = 250 s
    assert capacity > expected
    last = Forecast(method="last", window_s=10.0, history_s=200.0)
    mean = expected_rates_rps(arrivals, 200.0, 100.0, last, 400.0)[0]
    assert mean == pytest.approx(3.0, rel=0.08)  # the mean over [0, 200) s


def test_the_covering_yardstick_reads_the_peak_rate_until_the_next_plan_serves() -> None:
    from energyopt.sim.arrivals import Arrivals
    from energyopt.sim.forecast import raw_rates_rps

    # 1 req/s for 100 s, then 10 req/s: a plan at t = 60 s for one 30-s window sees
    # only the first rate; looking 20 s further it sees the burst's first 10 s
    t = np.concatenate([np.linspace(0, 99.9, 100), np.linspace(100, 199.99, 1000)])
    one = np.ones(t.size, dtype=np.int64)
    arr = Arrivals(t, np.zeros(t.size, dtype=np.int64), one, one, ("w",))
    ev = load_evaluation(
        Path(__file__).resolve().parents[1] / "instances/evaluate/quickstart-bursty.yaml"
    )
    plain = clairvoyant_evaluation(ev, 30.0).forecast
    cover = clairvoyant_evaluation(ev, 30.0, rate_window_s=10.0, lookahead_s=20.0).forecast
    assert (cover.window_s, cover.lookahead_s, cover.headroom) == (10.0, 20.0, 1.0)
    assert raw_rates_rps(arr, 60.0, 30.0, plain, 200.0)[0] == pytest.approx(1.0, rel=0.05)
    assert raw_rates_rps(arr, 60.0, 30.0, cover, 200.0)[0] == pytest.approx(10.0, rel=0.05)
    # the horizon bounds the look ahead
    assert raw_rates_rps(arr, 60.0, 30.0, cover, 95.0)[0] == pytest.approx(1.0, rel=0.05)


def test_only_the_oracle_may_look_ahead() -> None:
    from pydantic import ValidationError

    from energyopt.spec.evaluation import Forecast

    with pytest.raises(ValidationError, match="lookahead_s: only the oracle"):
        Forecast(method="trend", lookahead_s=5.0)


def test_the_plan_lead_is_power_on_then_the_heaviest_model_loading(tmp_path: Path) -> None:
    res = _result(tmp_path, 30.0)
    tr = res.evaluation.transitions
    weights = res.problem.model_of(res.problem.instance.workloads[0]).weight_bytes
    assert weights > 1e9
    lead = plan_lead_s(res.evaluation, res.problem)
    assert lead == pytest.approx(tr.power_on_s + tr.startup_s + weights / (tr.load_gbps * 1e9))
    # Llama-3.1-8B's 16 GB at the default 20 GB/s after 10 s on and a 2-s start
    assert 12.5 < lead < 13.2


def test_the_covering_yardstick_runs_under_the_online_control(tmp_path: Path) -> None:
    res = _result(tmp_path, 60.0)
    run = run_covering_clairvoyant(res)
    assert run.result.online is not None and run.result.online.decisions > 0
    assert run.tally.rejected_plans == 0 and run.tally.unplanned_epochs == 0
    assert len(run.tally.planned_rps) == math.ceil(60.0 / CLAIRVOYANT_WINDOW_S)
    assert run.result.arrived == len(res.arrivals)
    assert run.result.completed + run.result.shed == run.result.arrived


def test_evaluate_covering_yardstick_adds_its_row_beside_the_plain_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(tmp_path, [{"name": "performance-first", "kind": "performance-first"}])
    argv = ["evaluate", str(path), "-q", "--no-plots", "--yardstick", "--covering-yardstick"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("clairvoyant+online ") for line in out.splitlines())
    with (tmp_path / "out" / "summary.csv").open() as fh:
        rows = {r["planner"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"performance-first", "clairvoyant", "clairvoyant+online"}
    assert int(rows["clairvoyant+online"]["rejected_plans"]) == 0
    assert int(rows["clairvoyant+online"]["arrived"]) == int(rows["performance-first"]["arrived"])
    # a spec planner of the covering yardstick's name is refused, naming the file
    named = _spec(tmp_path, [{"name": "clairvoyant+online", "kind": "energyopt"}])
    assert main(["evaluate", str(named), "-q", "--no-plots", "--covering-yardstick"]) == 2
    assert "clairvoyant+online" in capsys.readouterr().err
