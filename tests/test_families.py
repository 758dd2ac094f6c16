"""The family contract: every kind goes through one registry, one Result and one
verifier API, for every CLI verb; a new family needs no CLI change."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import highspy
import pytest
from pydantic import BaseModel

from energyopt.cli import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_OK, EXIT_VIOLATION, main
from energyopt.families import _REGISTRY as REGISTRY
from energyopt.families import (
    NotExportable,
    SolverEntry,
    Stated,
    certify,
    families,
    family,
    register,
)
from energyopt.solvers.result import FEASIBLE, INFEASIBLE, OPTIMAL, Result, Status
from energyopt.spec.base import Spec
from energyopt.spec.io import parse, read_data
from energyopt.verify.violation import Violation

from .cli_helpers import read_exported

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "serving": ROOT / "instances" / "quickstart.yaml",
    "taskgraph": ROOT / "instances" / "taskgraph" / "lu-3x3-l4.yaml",
    "colocation": ROOT / "tests" / "data" / "colocation-small.yaml",
}
FAST_SOLVER = {"serving": "highs-exact", "taskgraph": "heuristic", "colocation": "exact"}


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def test_the_registry_lists_every_family_once() -> None:
    kinds = [f.kind for f in families()]
    assert kinds[:3] == ["serving", "taskgraph", "colocation"]
    assert len(set(kinds)) == len(kinds)
    with pytest.raises(ValueError, match="registered twice"):
        register(family("serving"))


def test_status_is_one_enum_that_reads_as_its_name() -> None:
    assert OPTIMAL is Status.OPTIMAL and OPTIMAL == "optimal"
    assert {str(s) for s in Status} == {"optimal", "feasible", "infeasible", "no_solution"}
    maxed: Result[int] = Result(FEASIBLE, 9.0, 10.0, 0.0, 1, "x", sense="max")
    assert maxed.gap == pytest.approx(1 / 9)


@pytest.mark.parametrize("kind", list(FILES))
def test_every_verb_works_for_every_kind(
    kind: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = str(FILES[kind])
    code, out, _ = run(capfd, "validate", path)
    assert code == EXIT_OK and ": ok (" in out
    code, out, _ = run(capfd, "show", path)
    assert code == EXIT_OK and out.strip()
    plan = tmp_path / "plan.json"
    args = ["solve", path, "--solver", FAST_SOLVER[kind], "-q", "-o", str(plan)]
    args += ["--time-limit", "20"]
    code, out, err = run(capfd, *args)
    assert code == EXIT_OK, err
    data = json.loads(plan.read_text())
    code, out, err = run(capfd, "verify", path, str(plan))
    assert code == EXIT_OK, err
    assert "feasible" in out and "recomputed" in out
    # The stated objective is the plan's own: a different one is a violation.
    stated_key = "objective_value" if kind == "taskgraph" else "objective"
    bad = dict(data, **{stated_key: data[stated_key] * 1.5 + 1})
    bad_plan = tmp_path / "bad.json"
    bad_plan.write_text(json.dumps(bad))
    code, _, err = run(capfd, "verify", path, str(bad_plan))
    assert code == EXIT_VIOLATION and "[objective]" in err
    code, out, _ = run(capfd, "schema", kind)
    assert code == EXIT_OK and json.loads(out)["type"] == "object"
    code, out, _ = run(capfd, "schema", f"{kind}-plan")
    assert code == EXIT_OK and "properties" in json.loads(out)


@pytest.mark.parametrize("kind", list(FILES))
def test_every_solver_of_a_family_returns_a_certified_result(kind: str) -> None:
    fam = family(kind)
    problem = fam.load(str(FILES[kind]), [])
    for entry in fam.solvers():
        assert entry.family == kind
        assert entry.guarantee in ("exact", "certified bound", "heuristic")
        if kind == "serving" and entry.name not in ("highs-exact", "shadow-price"):
            continue  # every serving preset: tests/test_serving_differential.py
        if kind == "taskgraph" and entry.name in ("auto", "cpsat"):
            continue  # CP-SAT on task graphs: tests/test_taskgraph_solvers.py
        res = fam.solve(problem, entry.name, time_limit_s=20, rel_gap=None, progress=print)
        certify(fam, problem, res, 1e-3, print)
        assert res.plan is not None, (entry.name, res.log)
        assert isinstance(res.status, Status)
        assert fam.verify(problem, res.plan) == []
        assert res.objective == pytest.approx(fam.cost(problem, res.plan), rel=1e-9)
        assert res.sense == fam.sense(problem)
        if entry.guarantee == "heuristic":
            assert res.bound is None or res.status == FEASIBLE
        else:
            assert res.bound is not None, entry.name


def test_a_serving_plan_that_fails_verification_is_never_hidden_by_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatcher falls back only on 'not applicable' and backend failures."""
    from energyopt.families.serving.solvers import solve as solving
    from energyopt.solvers.presets import load_preset

    fam = family("serving")
    problem = fam.load(str(FILES["serving"]), [])
    real = solving.evaluate_plan

    def broken(problem: Any, plan: Any) -> Any:
        ev = real(problem, plan)
        ev.violations.append(Violation("demand", "x", "injected"))
        return ev

    monkeypatch.setattr(solving, "evaluate_plan", broken)
    with pytest.raises(solving.PlanVerificationError, match="injected"):
        solving.solve(problem, load_preset("pop"), time_limit_s=20)


def test_serving_export_reads_back_to_the_same_optimum(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    fam = family("serving")
    problem = fam.load(str(FILES["serving"]), [])
    res = fam.solve(problem, "highs-exact", time_limit_s=60, rel_gap=1e-9, progress=print)
    for fmt in ("mps", "lp"):
        out = tmp_path / f"quickstart.{fmt}"
        code, _, err = run(capfd, "export", str(FILES["serving"]), "-o", str(out))
        assert code == EXIT_OK, err
        h = read_exported(out)
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.run()
        assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        assert h.getInfo().objective_function_value == pytest.approx(res.objective, rel=1e-6)


def test_colocation_export_is_the_exact_solvers_milp(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from energyopt.families.colocation.formulations.milp import build_milp
    from energyopt.families.colocation.formulations.model import build_model
    from energyopt.families.colocation.solvers.exact import solve_exact

    out = tmp_path / "coloc.mps"
    code, _, err = run(capfd, "export", str(FILES["colocation"]), "-o", str(out))
    assert code == EXIT_OK, err
    h = read_exported(out)
    h.run()
    fam = family("colocation")
    problem = fam.load(str(FILES["colocation"]), [])
    model = build_model(problem)
    assert h.getLp().num_col_ == len(build_milp(model))
    res = solve_exact(model, rel_gap=1e-9)
    assert res.status == OPTIMAL and res.objective is not None
    raw = h.getInfo().objective_function_value
    assert model.display_objective(raw) == pytest.approx(res.objective, rel=1e-6)


def test_task_graphs_are_not_exportable(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capfd, "export", str(FILES["taskgraph"]), "-o", str(tmp_path / "t.mps"))
    assert code == EXIT_BAD_INPUT and "no MPS or LP form" in err
    assert not (tmp_path / "t.mps").exists()


def test_a_schedule_with_an_unknown_clock_names_the_entry(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "s.json"
    path = str(FILES["taskgraph"])
    assert run(capfd, "solve", path, "--solver", "heuristic", "-q", "-o", str(plan))[0] == 0
    data = json.loads(plan.read_text())
    data["tasks"][0]["clock_mhz"] = 123
    plan.write_text(json.dumps(data))
    code, _, err = run(capfd, "verify", path, str(plan))
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"{plan}: tasks[0](") and "clock_mhz: 123 MHz" in err


# A family written here, against the contract only: one GPU, a few clocks, a job of
# given work; pick the clock of least energy within a deadline. Registering it is
# all it takes for validate, show, solve, verify and schema to handle its files.


class ClockChoice(Spec):
    kind: Literal["clock-choice"]
    name: str
    work_gcycles: float
    deadline_s: float
    clocks_mhz: tuple[int, ...]
    idle_w: float
    w_per_mhz2: float


class ClockPlan(Spec):
    clock_mhz: int
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None


class ClockChoiceFamily:
    kind = "clock-choice"
    title = "one job on one GPU: least-energy clock within a deadline"
    problem_model: type[BaseModel] = ClockChoice
    plan_model: type[BaseModel] = ClockPlan

    def load(self, path: str, catalogs: Sequence[str]) -> ClockChoice:
        return parse(ClockChoice, read_data(path), path)

    def load_for_plan(self, path: str, catalogs: Sequence[str]) -> ClockChoice:
        return self.load(path, catalogs)

    def summary(self, p: ClockChoice) -> str:
        return f"{len(p.clocks_mhz)} clocks"

    def show(self, p: ClockChoice) -> list[str]:
        return [f"{c} MHz: {self._energy(p, c):.1f} J" for c in p.clocks_mhz]

    def solvers(self) -> list[SolverEntry]:
        return [SolverEntry("enumerate", self.kind, "exact", "try every clock")]

    def _time(self, p: ClockChoice, clock: int) -> float:
        return p.work_gcycles * 1e3 / clock

    def _energy(self, p: ClockChoice, clock: int) -> float:
        return (p.idle_w + p.w_per_mhz2 * clock**2) * self._time(p, clock)

    def solve(self, p: ClockChoice, solver: str, **_: Any) -> Result[ClockPlan]:
        ok = [c for c in p.clocks_mhz if self._time(p, c) <= p.deadline_s]
        if not ok:
            return Result(INFEASIBLE, None, None, 0.0, None, solver, diagnosis=["too slow"])
        best = min(ok, key=lambda c: self._energy(p, c))
        energy = self._energy(p, best)
        return Result(OPTIMAL, energy, energy, 0.0, ClockPlan(clock_mhz=best), solver)

    def verify(self, p: ClockChoice, plan: ClockPlan) -> list[Violation]:
        if plan.clock_mhz not in p.clocks_mhz:
            return [Violation("clock", "plan", f"{plan.clock_mhz} MHz is not offered")]
        if self._time(p, plan.clock_mhz) > p.deadline_s:
            return [Violation("deadline", "plan", "finishes after the deadline")]
        return []

    def cost(self, p: ClockChoice, plan: ClockPlan) -> float:
        return self._energy(p, plan.clock_mhz)

    def sense(self, p: ClockChoice) -> Literal["min", "max"]:
        return "min"

    def objective_unit(self, p: ClockChoice) -> str:
        return "J"

    def report(self, p: ClockChoice, result: Result[ClockPlan]) -> list[str]:
        assert result.plan is not None
        return [f"clock {result.plan.clock_mhz} MHz, energy {result.objective:.1f} J"]

    def to_file(self, p: ClockChoice, result: Result[ClockPlan]) -> BaseModel:
        assert result.plan is not None
        return result.plan.model_copy(
            update={"objective": result.objective, "bound": result.bound, "gap": result.gap}
        )

    def from_file(self, p: ClockChoice, data: Any, source: str) -> tuple[ClockPlan, Stated]:
        plan = parse(ClockPlan, data, source)
        return plan, Stated(plan.objective, plan.bound, plan.gap)

    def program(self, p: ClockChoice) -> Any:
        raise NotExportable("enumerated, not a mathematical program")


@pytest.fixture
def clock_family() -> Iterator[None]:
    register(ClockChoiceFamily())
    yield
    del REGISTRY["clock-choice"]


def test_a_new_family_needs_only_the_contract_and_registration(
    clock_family: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    problem = tmp_path / "job.yaml"
    data = {
        "kind": "clock-choice",
        "name": "job",
        "work_gcycles": 2.0,
        "deadline_s": 2.0,
        "clocks_mhz": [900, 1200, 1500],
        "idle_w": 60.0,
        "w_per_mhz2": 4e-5,
    }
    problem.write_text(json.dumps(data))
    assert run(capfd, "validate", str(problem))[1].endswith("ok (3 clocks)\n")
    plan = tmp_path / "plan.json"
    code, out, err = run(capfd, "solve", str(problem), "-q", "-o", str(plan))
    assert code == EXIT_OK, err
    assert "clock 1200 MHz" in out  # 900 MHz misses the deadline, 1500 costs more
    assert run(capfd, "verify", str(problem), str(plan))[0] == EXIT_OK
    assert "enumerate" in run(capfd, "solvers")[1]
    assert "clock_mhz" in run(capfd, "schema", "clock-choice-plan")[1]
    data["deadline_s"] = 1.0
    problem.write_text(json.dumps(data))
    code, _, err = run(capfd, "solve", str(problem), "-q")
    assert code == EXIT_INFEASIBLE and "too slow" in err
