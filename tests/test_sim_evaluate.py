"""``energyopt evaluate``: the spec file, the planners, the table and the files."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from energyopt.catalog.problem import Problem
from energyopt.cli import main
from energyopt.families.serving import plots

BASE = {
    "name": "eval-tiny",
    "cluster": {"nodes": [{"name": "n0", "gpus": [{"type": "H100-SXM5-80GB", "count": 2}]}]},
    "workloads": [
        {
            "name": "chat",
            "model": "Llama-3.1-8B",
            "rate_rps": 6.0,
            "prompt_tokens": {"mean": 512},
            "output_tokens": {"mean": 128},
            "slo": {"ttft_ms": 500, "tbt_ms": 60},
        }
    ],
    "options": {"clocks_mhz": {"H100-SXM5-80GB": [990, 1410, 1980]}},
}


def write_spec(tmp_path: Path, **changes: object) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    spec: dict[str, object] = {
        "kind": "evaluate",
        "name": "tiny",
        "base": "base.yaml",
        "load": {"kind": "diurnal", "amplitude": 0.5},
        "duration_s": 60,
        "epoch_s": 30,
        "planners": [
            {"name": "performance-first", "kind": "performance-first"},
            {"name": "frequency-only", "kind": "frequency-only"},
            {"name": "joint", "kind": "energyopt"},
            {"name": "lookup", "kind": "table", "table": "absent.eot"},
        ],
        "output_dir": str(tmp_path / "out"),
    }
    spec.update(changes)
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_evaluate_prints_the_table_and_writes_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "_pyplot", lambda: None)  # as without matplotlib
    assert main(["evaluate", str(write_spec(tmp_path)), "-q"]) == 0
    out = capsys.readouterr().out
    for name in ("performance-first", "frequency-only", "joint"):
        assert name in out
    assert "skipped: lookup: table absent.eot not found" in out
    assert "pip install 'energyopt[plot]'" in out
    with (tmp_path / "out" / "summary.csv").open() as fh:
        rows = {r["planner"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"performance-first", "frequency-only", "joint"}
    for r in rows.values():
        assert int(r["arrived"]) == int(r["completed"]) > 0
        assert float(r["energy_j"]) > 0
        assert int(r["rejected_plans"]) == 0
    assert float(rows["performance-first"]["saving"]) == 0.0
    with (tmp_path / "out" / "gpus_on.csv").open() as fh:
        steps = list(csv.DictReader(fh))
    assert {r["planner"] for r in steps} == set(rows)
    assert all(0 <= int(r["gpus_on"]) <= 2 for r in steps)
    # clock tuning on the same dedicated GPUs cannot cost more modelled power
    assert float(rows["frequency-only"]["predicted_j"]) <= float(
        rows["performance-first"]["predicted_j"]
    ) * (1 + 1e-6)


def test_evaluate_writes_plots_when_matplotlib_is_there(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    spec = write_spec(
        tmp_path, planners=[{"name": "pf", "kind": "performance-first"}], reference="pf"
    )
    assert main(["evaluate", str(spec), "-q", "--duration", "20"]) == 0
    for name in ("evaluation.png", "power.png", "slo.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"colour": "red"}, "eval.yaml: colour: Extra inputs are not permitted"),
        ({"duration_s": -1}, "eval.yaml: duration_s: Input should be greater than 0"),
        ({"reference": "nobody"}, "reference 'nobody' is not a planner"),
        (
            {"planners": [{"name": "x", "kind": "energyopt", "solver": "nope"}], "reference": "x"},
            "planners[0](x): --solver: unknown solver 'nope'",
        ),
        ({"base": "missing.yaml"}, "base: no such file"),
        ({"load": {"kind": "trace"}}, "eval.yaml: load.trace.file: Field required"),
    ],
)
def test_bad_specs_name_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], message: str
) -> None:
    assert main(["evaluate", str(write_spec(tmp_path, **changes)), "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_table_planner_replays_plans_of_a_compiled_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from energyopt.families.serving.tables import compile_table

    spec = write_spec(
        tmp_path,
        planners=[
            {"name": "performance-first", "kind": "performance-first"},
            {"name": "lookup", "kind": "table", "table": "plans.eot"},
        ],
        load={"kind": "diurnal", "amplitude": 0.5, "load_scale": 0.8},
    )
    compile_spec = tmp_path / "compile.yaml"
    compile_spec.write_text(
        yaml.safe_dump({"kind": "plans", "base": "base.yaml", "load_scale": [0.5, 1.0, 1.5]})
    )
    compile_table(compile_spec, tmp_path / "plans.eot")
    assert main(["evaluate", str(spec), "-q", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "lookup" in out and "skipped" not in out
    with (tmp_path / "out" / "summary.csv").open() as fh:
        rows = {r["planner"]: r for r in csv.DictReader(fh)}
    lookup = rows["lookup"]
    assert int(lookup["arrived"]) == int(lookup["completed"]) > 0
    assert int(lookup["rejected_plans"]) == 0
    assert int(lookup["solves"]) == 0


def test_evaluate_keeps_the_catalog_given_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived problems (each epoch's rates, the baselines' options) stay bound to the
    catalog of --catalog: a GPU type defined only there keeps working."""
    from energyopt.catalog import builtin_catalog

    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    h100 = builtin_catalog().gpu("H100-SXM5-80GB").model_dump(mode="json")
    h100["name"] = "H100-site-tuned"
    h100.pop("sources", None)
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"gpus": [h100]}))
    base = dict(BASE)
    base["cluster"] = {"nodes": [{"name": "n0", "gpus": [{"type": "H100-site-tuned", "count": 2}]}]}
    base["options"] = {"clocks_mhz": {"H100-site-tuned": [990, 1410, 1980]}}
    spec = write_spec(
        tmp_path,
        planners=[
            {"name": "performance-first", "kind": "performance-first"},
            {"name": "joint", "kind": "energyopt"},
        ],
    )
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    assert main(["validate", str(spec), "--catalog", str(extra)]) == 0
    assert main(["evaluate", str(spec), "-q", "--no-plots", "--catalog", str(extra)]) == 0
    out = capsys.readouterr().out
    assert "joint" in out and "performance-first" in out


def _tiny_planner(kind: str) -> tuple[object, dict[str, float]]:
    from energyopt.catalog.problem import resolve
    from energyopt.families.serving.planners import make_planner
    from energyopt.spec.evaluation import PlannerSpec
    from energyopt.spec.instance import Instance

    problem = resolve(Instance.model_validate(BASE), "base.yaml")
    planner = make_planner(PlannerSpec(name=kind, kind=kind), problem, "eval.yaml")  # type: ignore[arg-type]
    return planner, {"chat": 6.0}


def _capacity_up_to(
    monkeypatch: pytest.MonkeyPatch, most_rps: float, lp_serves: bool = False
) -> None:
    """Make the planner's capacity test pack nothing above ``most_rps`` (req/s of
    the first workload), as the faked solves below serve nothing above it: proven
    (the LP leaves demand unserved), or undecided where ``lp_serves``. The planner
    does not fill an overloaded plan (``fill_overload`` off, the default): the fill
    takes the real operating points, which the fakes do not limit."""
    from energyopt.families.serving.solvers import capacity


    real = capacity.packed_plan

    def packed_plan(problem: Problem) -> capacity.Capacity:
        if problem.instance.workloads[0].rate_rps > most_rps + 1e-9:
            return capacity.Capacity(True, lp_serves, None)
        return real(problem)

    monkeypatch.setattr(capacity, "packed_plan", packed_plan)


@pytest.mark.parametrize("status", ["no_solution", "infeasible"])
def test_a_planner_backs_off_when_no_plan_is_found_and_says_whether_it_was_proven(
    monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """A solve that runs out of time without a plan (as highs-exact did on fleet-16's
    diurnal load at t = 0) must not leave the run without a plan: the planner backs
    off to 90 % of the forecast (the largest fraction its capacity test packs) and
    marks the shortfall unproven; after a proof of infeasibility it backs off too,
    marked proven."""
    from energyopt.families.serving.solvers import solve as serving
    from energyopt.solvers.result import Result, Status

    real = serving.solve
    seen: list[float] = []

    def solve(problem, preset, **kw):  # type: ignore[no-untyped-def]
        rate = problem.instance.workloads[0].rate_rps
        seen.append(rate)
        if rate > 5.9:
            return Result(Status(status), None, None, 0.0, None, "fake")
        return real(problem, preset, **kw)

    monkeypatch.setattr(serving, "solve", solve)
    _capacity_up_to(monkeypatch, 5.9)
    planner, rates = _tiny_planner("energyopt")
    out = planner.plan(rates)  # type: ignore[attr-defined]
    assert out.plan is not None
    assert out.served_fraction == pytest.approx(0.9)
    assert out.unproven is (status == "no_solution")
    assert seen == pytest.approx([6.0, 5.4])
    again = planner.plan(rates)  # type: ignore[attr-defined]
    assert (again.solves, again.unproven) == (0, out.unproven)  # from the cache, same verdict


@pytest.mark.parametrize("lp_serves", [False, True])
def test_a_back_off_is_proven_only_where_the_fraction_above_is(
    monkeypatch: pytest.MonkeyPatch, lp_serves: bool
) -> None:
    """After a proof that the whole forecast is infeasible, the planner backs off to
    90 %; whether the epoch counts as proven rests on the fraction above it too: the
    81 % rung's capacity test proves it infeasible (its LP leaves demand unserved),
    or only packs nothing (its LP serves every rate: a plan may exist)."""
    from energyopt.families.serving.solvers import solve as serving
    from energyopt.solvers.result import INFEASIBLE, Result

    real = serving.solve

    def solve(problem, preset, **kw):  # type: ignore[no-untyped-def]
        if problem.instance.workloads[0].rate_rps > 5.9:
            return Result(INFEASIBLE, None, None, 0.0, None, "fake")
        return real(problem, preset, **kw)

    monkeypatch.setattr(serving, "solve", solve)
    # 6 req/s infeasible by the solve; 5.4 (90 %) above what the capacity test packs
    _capacity_up_to(monkeypatch, 5.0, lp_serves)
    planner, rates = _tiny_planner("energyopt")
    out = planner.plan(rates)  # type: ignore[attr-defined]
    assert out.plan is not None
    assert out.served_fraction == pytest.approx(0.81)
    assert out.unproven is lp_serves


def test_a_back_off_solve_cut_by_its_net_gives_way_to_the_capacity_tests_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one solve at the settled fraction: where a time share cut it, its plan
    (which a rerun on another load may not repeat) is dropped for the capacity
    test's, which reads no clock; the epoch is marked unproven."""
    from energyopt.families.serving.solvers import capacity
    from energyopt.families.serving.solvers import solve as serving
    from energyopt.solvers.result import INFEASIBLE, Result, Termination

    real = serving.solve

    def solve(problem, preset, **kw):  # type: ignore[no-untyped-def]
        if problem.instance.workloads[0].rate_rps > 5.9:
            return Result(INFEASIBLE, None, None, 0.0, None, "fake")
        out = real(problem, preset, **kw)
        out.termination = Termination.TIME_LIMIT
        return out

    monkeypatch.setattr(serving, "solve", solve)
    _capacity_up_to(monkeypatch, 5.9)
    planner, rates = _tiny_planner("energyopt")
    out = planner.plan(rates)  # type: ignore[attr-defined]
    assert out.plan is not None and out.unproven
    assert out.served_fraction == pytest.approx(0.9)
    assert out.plan.solver == capacity.SOLVER_NAME and out.bound is None


@pytest.mark.parametrize("capacity_test", [True, False])
def test_a_planner_under_a_deep_overload_finds_the_largest_fraction_that_fits(
    monkeypatch: pytest.MonkeyPatch, capacity_test: bool
) -> None:
    """A forecast 5x what the fleet serves (a headroom of 5.5 on the bundled bursty
    spec left every planner with "no plan for the initial load"): past the 0.9 steps
    the planner halves the fraction, then bisects (with its capacity test, or with a
    solve per fraction where the test does not apply), and plans for a fraction
    within 8 % of the largest that fits, never above it."""
    from energyopt.families.serving.solvers import solve as serving
    from energyopt.solvers.result import INFEASIBLE, Result

    real = serving.solve
    fits = 1.2  # req/s: the largest load the fake fleet serves
    seen: list[float] = []

    def solve(problem, preset, **kw):  # type: ignore[no-untyped-def]
        rate = problem.instance.workloads[0].rate_rps
        seen.append(rate)
        if rate > fits + 1e-9:
            return Result(INFEASIBLE, None, None, 0.0, None, "fake")
        return real(problem, preset, **kw)

    monkeypatch.setattr(serving, "solve", solve)
    if capacity_test:
        _capacity_up_to(monkeypatch, fits)
    else:
        from energyopt.families.serving.solvers import capacity

        monkeypatch.setattr(
            capacity, "packed_plan", lambda _problem: capacity.Capacity(False, False, None)
        )
    planner, rates = _tiny_planner("energyopt")
    out = planner.plan(rates)  # type: ignore[attr-defined]
    assert out.plan is not None and not out.unproven
    served = out.served_fraction * rates["chat"]
    assert 0.92 * fits <= served <= fits + 1e-9
    assert out.solves == len(seen) <= 6 + 7 + 3
    if not capacity_test:  # every fraction tried was solved
        assert len(seen) > 6
