"""Keep-alive forecasts given as inter-arrival histograms: the expected requests per
window they stand for, every solver against brute force on them, and bad
histograms refused naming the file and field."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, main
from energyopt.families.keepalive.formulations.model import build_problem, load_keepalive
from energyopt.families.keepalive.solvers.lagrangian import solve_lagrangian
from energyopt.families.keepalive.solvers.milp import solve_milp, solve_rolling
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from energyopt.spec.errors import SpecError

from .test_keepalive import _brute_force, _random_instance, _small


def _as_histogram(doc: dict[str, Any], seed: int) -> dict[str, Any]:
    """``doc`` with every function's per-window counts replaced by a histogram of
    inter-arrival times around the same rate (fractional expected requests)."""
    rng = random.Random(seed)
    window = float(doc["window_s"])
    for fn in doc["functions"]:
        arrivals = fn.pop("arrivals")
        rate = max(sum(arrivals) / len(arrivals), 0.3)
        bin_s = window / rng.choice([4, 8])
        mean_bin = window / rate / bin_s - 0.5
        counts = [0] * (int(mean_bin) + 3)
        for _ in range(rng.randint(1, 4)):
            counts[max(0, round(mean_bin + rng.uniform(-1.5, 1.5)))] += rng.randint(1, 5)
        fn["inter_arrivals"] = {"bin_s": bin_s, "counts": counts, "windows": len(arrivals)}
    return doc


def test_a_histogram_stands_for_window_over_mean_requests_in_every_window() -> None:
    # 3 inter-arrival times in the 20..40 s bin (30 s at its centre): 60 s / 30 s = 2
    hist = _small()
    hist["functions"][0].pop("arrivals")
    hist["functions"][0]["inter_arrivals"] = {"bin_s": 20, "counts": [0, 3], "windows": 3}
    counts = _small()
    counts["functions"][0]["arrivals"] = [2, 2, 2]
    by_hist = build_problem(KeepAliveFile.model_validate(hist))
    by_counts = build_problem(KeepAliveFile.model_validate(counts))
    assert by_hist.arrivals.tolist() == by_counts.arrivals.tolist()
    a, b = solve_milp(by_hist, rel_gap=1e-9), solve_milp(by_counts, rel_gap=1e-9)
    assert a.status == b.status == OPTIMAL
    assert a.objective == pytest.approx(b.objective, rel=1e-9)
    # a mixed histogram: mean (2 x 10 + 1 x 50) / 3 s, so 60 / (70 / 3) requests a window
    spec = KeepAliveFile.model_validate(hist)
    fn = spec.functions[0].model_validate(
        {
            **spec.functions[0].model_dump(exclude={"inter_arrivals"}),
            "inter_arrivals": {"bin_s": 20, "counts": [2, 0, 1], "windows": 3},
        }
    )
    assert fn.window_arrivals(60.0) == pytest.approx((60 / (70 / 3),) * 3)


@pytest.mark.parametrize("seed", range(10))
def test_every_solver_against_brute_force_on_histogram_forecasts(seed: int) -> None:
    spec = KeepAliveFile.model_validate(_as_histogram(_random_instance(seed), seed))
    assert all(fn.inter_arrivals is not None for fn in spec.functions)
    p = build_problem(spec)
    optimum = _brute_force(spec)
    exact = solve_milp(p, rel_gap=1e-9)
    if optimum is None:
        assert exact.status == INFEASIBLE
        return
    assert exact.status == OPTIMAL and exact.plan is not None
    assert exact.objective == pytest.approx(optimum, rel=1e-9)
    lag = solve_lagrangian(p, max_iterations=60)
    assert lag.bound is not None and lag.bound <= optimum * (1 + 1e-9) + 1e-6
    for res in (lag, solve_rolling(p, lookahead=1, step=1)):
        if res.plan is not None:
            ev = evaluate_keepalive(spec, res.plan)
            assert ev.violations == [] and ev.energy_j >= optimum * (1 - 1e-9)
            assert res.objective == pytest.approx(ev.energy_j, rel=1e-9)


def test_the_brute_force_seeds_have_fractional_forecasts_and_both_outcomes() -> None:
    fractional, outcomes = False, set()
    for seed in range(10):
        p = build_problem(KeepAliveFile.model_validate(_as_histogram(_random_instance(seed), seed)))
        fractional |= bool((p.arrivals != p.arrivals.round()).any())
        outcomes.add(solve_milp(p).status)
    assert fractional and outcomes == {OPTIMAL, INFEASIBLE}


def _with(inter: Any, keep_arrivals: bool = False) -> dict[str, Any]:
    doc = _small()
    if not keep_arrivals:
        doc["functions"][0].pop("arrivals")
    if inter is not None:
        doc["functions"][0]["inter_arrivals"] = inter
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_with({"bin_s": 20, "counts": [1], "windows": 3}, keep_arrivals=True), "functions[0]"),
        (_with(None), "functions[0]"),
        (_with({"bin_s": 20, "counts": [1, -1], "windows": 3}), "functions[0](big).inter_arrivals"),
        (_with({"bin_s": 20, "counts": [0, 0], "windows": 3}), "functions[0](big).inter_arrivals"),
        (
            _with({"bin_s": 0, "counts": [1], "windows": 3}),
            "functions[0](big).inter_arrivals.bin_s",
        ),
        (_with({"bin_s": 20, "counts": [1], "windows": 0}), "functions[0](big).inter_arrivals"),
        (_with({"bin_s": 20, "counts": [1], "windows": 4}), "(top level)"),
        (_with({"bin_s": 1e-9, "counts": [1], "windows": 3}), "functions[0](big).inter_arrivals"),
    ],
)
def test_bad_histograms_are_named_by_file_and_field(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], doc: dict[str, Any], field: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as info:
        load_keepalive(path)
    assert f"{path}: {field}" in str(info.value)
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    err = capfd.readouterr().err
    assert err.startswith(f"{path}: ") and "Traceback" not in err
