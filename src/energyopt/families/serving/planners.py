"""Planners: turn a load forecast into a fleet plan.

Every baseline is the serving problem with a restricted decision space, solved
by the same verified solver, so each baseline plan passes ``verify_plan`` at its
planned load:

| planner | clocks | SM sharing | re-planned |
| --- | --- | --- | --- |
| performance-first | max only | exclusive (dedicated GPUs) | no: once, for the peak |
| consolidation-only | max only | exclusive | every epoch (GPUs off when idle) |
| frequency-only | all candidates | exclusive | every epoch (DynamoLLM, throttLL'eM) |
| sharing-only | max only | the instance's (MPS / MIG) | every epoch (MuxServe) |
| energyopt | all candidates | the instance's | every epoch (joint) |
| table | from a compiled plan table | | every epoch (one lookup) |
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.families.serving.tables import VERSION as PLANS_VERSION
from energyopt.families.serving.tables import scaled_problem
from energyopt.solvers.presets import SolverPreset, load_preset
from energyopt.solvers.result import INFEASIBLE, Termination
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import PlannerSpec
from energyopt.spec.plan import GpuPlan, Placement, Plan
from energyopt.spec.workload import Phase

if TYPE_CHECKING:
    from energyopt.families.serving.solvers.capacity import Capacity, Filled

BACKOFF = 0.9
"""When a forecast is infeasible (or no plan for it is found in the time limit),
plan for this fraction of it, and so on."""
BACKOFF_STEPS = 6
DEEP_BACKOFF = 0.5
"""Past the BACKOFF_STEPS fractions (down to 59 %), halve the fraction (a load
above 1.7 x what the fleet serves: a spike, or a headroom set too high) ..."""
DEEP_STEPS = 7
"""... down to 0.9^5 / 2^7, under 0.5 %; then bisect between the fraction that
fits and the one above it that did not ..."""
REFINE_STEPS = 3
"""... this many times (to within 1 - 2^(-1/8), about 8 %, of the largest)."""
RAISE_STEP = 0.05
"""Where the back-off settled below 1, single workloads are raised above it
(``raise_fractions``) in steps of this fraction of their forecast."""
BACKOFF_LIMIT_S = 120.0
"""Safety net of the one solve at the fraction the back-off settles on, s, in place
of the planner's time limit (the larger one counts): that solve stops on its
preset's effort limits (nodes, rounds), so on any load it ends the same way while
the net is not reached; where a time share of it cut a stage
(``Termination.TIME_LIMIT``) its plan is dropped for the capacity test's, which
reads no clock (fleet-16 at 3.4-3.6 x its rates: branch-and-price proved 65.6 %
optimal in 16.8 s at a load average of 1.5; a net of 600 s let one diurnal+spikes
epoch at 60-s epochs run 11 minutes)."""


@dataclass(frozen=True)
class Planned:
    """A planner's answer for one forecast."""

    plan: Plan | None
    wall_s: float
    solves: int  # solver runs (0: answered from cache or a table)
    served_fraction: float
    """1.0, or where the forecast was backed off the least fraction of any workload's
    forecast the plan serves: the fraction backed off to, or more where the plan was
    filled (``filled_plan``) and every workload got some of the fill."""
    bound: float | None = None
    objective: float | None = None
    unproven: bool = False  # backed off without a proof that the next fraction up is
    # infeasible (a time limit, or a capacity test that packed nothing its LP serves)
    served: dict[str, float] | None = None
    """Per workload, the fraction of its forecast the plan serves (req/s routed over
    req/s forecast), where the forecast was backed off; None where it was not."""
    time_limited: bool = False
    """The plan is the best of a solve its time limit cut: another run, on a busier
    or a quieter machine, may return another plan for the same forecast."""


def restricted(
    problem: Problem,
    *,
    max_clock_only: bool,
    exclusive: bool,
    latency_margin: float | Literal["calibrated"] | None = None,
) -> Problem:
    """``problem`` with only the max clock and/or without SM sharing, and planned with
    ``latency_margin`` (``Options.latency_margin``) where given."""
    inst = problem.instance
    opts = inst.options
    if latency_margin is not None:
        opts = opts.model_copy(update={"latency_margin": latency_margin})
    if max_clock_only:
        clocks = {t: (problem.gpu_type(t).max_sm_clock_mhz,) for t in problem.gpu_types_used()}
        opts = opts.model_copy(update={"clocks_mhz": clocks})
    if exclusive:
        opts = opts.model_copy(
            update={"sharing": opts.sharing.model_copy(update={"mode": "exclusive"})}
        )
    return problem.with_instance(inst.model_copy(update={"options": opts}))


class SolverPlanner:
    """Plans by solving the (restricted) serving problem at the forecast rates."""

    def __init__(
        self, spec: PlannerSpec, problem: Problem, preset: SolverPreset, *, static: bool
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.static = static
        max_only = spec.kind in ("performance-first", "consolidation-only", "sharing-only")
        exclusive = spec.kind in ("performance-first", "consolidation-only", "frequency-only")
        self.problem = restricted(
            problem,
            max_clock_only=max_only,
            exclusive=exclusive,
            latency_margin=spec.latency_margin,
        )
        self.preset = preset
        self.base_rates = {w.name: w.rate_rps for w in problem.instance.workloads}
        self._cache: dict[tuple[float, ...], Planned] = {}

    def plan(self, rates_rps: dict[str, float]) -> Planned:
        """A verified plan serving ``rates_rps``, or the largest fraction of it that
        fits, solved or taken from the cache.

        The forecast itself is solved first, with the planner's preset and time
        limit. Where that gives no plan (proved infeasible, or its time limit ran
        out: the answer then says ``unproven``), the forecast is backed off by a rule
        that does not read the clock (``settle_fraction``): the fraction is the largest on
        a fixed ladder at which the capacity test (``solvers.capacity``: column
        generation and residual packing, both on counted work) packs a plan, and
        that fraction is solved once more, with the preset's effort limits and
        ``BACKOFF_LIMIT_S`` as its safety net instead of the planner's time limit
        (the capacity test's plan stands where that solve gives none or a time share
        cut it). With the spec's ``fill_overload``, single workloads are first raised above that
        fraction where the capacity test still packs (``raise_fractions``; where one
        is, the capacity test's plan at the raised rates is taken, not solved
        again), and the GPUs the plan leaves off are then given to the workloads
        with forecast unserved (``capacity.filled_plan``); ``served`` then gives
        each workload's fraction and ``served_fraction`` the least of them. So the
        fractions and the plan depend on the forecast, not on the machine's load.
        Where the configuration formulation does not apply (no capacity test),
        each fraction of the ladder is solved instead, with the planner's time
        limit (at most BACKOFF_STEPS + DEEP_STEPS + REFINE_STEPS solves)."""
        key = tuple(round(rates_rps[n], 9) for n in self.base_rates)
        hit = self._cache.get(key)
        if hit is not None:
            return replace(hit, wall_s=0.0, solves=0)
        from energyopt.families.serving.solvers.capacity import Capacity, filled_plan, packed_plan
        from energyopt.families.serving.solvers.solve import solve

        start = time.perf_counter()
        solves = 0
        unproven = False
        out: Planned | None = None
        proved = False  # the last solve without a plan proved its rates infeasible

        def scaled(at: float | dict[str, float]) -> Problem:
            def of(n: str) -> float:
                return at if isinstance(at, float) else at[n]

            return scaled_problem(
                self.problem, {n: of(n) * rates_rps[n] / r for n, r in self.base_rates.items()}
            )

        def attempt(at: float, limit_s: float | None = None) -> bool:
            nonlocal out, solves, unproven, proved
            result = solve(
                scaled(at),
                self.preset,
                time_limit_s=self.spec.time_limit_s if limit_s is None else limit_s,
                rel_gap=self.spec.rel_gap,
            )
            solves += 1
            if limit_s is not None and result.termination == Termination.TIME_LIMIT:
                unproven = True  # the net cut it: its plan would depend on the load
                return False
            if result.plan is None:
                proved = result.status == INFEASIBLE
                unproven = unproven or not proved
                return False
            out = Planned(
                result.plan,
                0.0,
                solves,
                at,
                result.bound,
                result.objective,
                unproven,
                time_limited=result.termination == Termination.TIME_LIMIT,
            )
            return True

        if not attempt(1.0):
            # 1 x the forecast again only where its solve proved nothing
            settled = settle_fraction(lambda at: packed_plan(scaled(at)), with_top=unproven)
            if settled is not None:  # the capacity test applies
                unproven = unproven or settled.undecided
                if settled.fraction > 0.0:
                    assert settled.plan is not None
                    served = [n for n, r in rates_rps.items() if r > 0]
                    at_settled = Capacity(True, True, settled.plan, settled.objective)
                    raised = (
                        raise_fractions(
                            lambda each: packed_plan(scaled(each)),
                            served,
                            settled.fraction,
                            at_settled,
                        )
                        if self.spec.fill_overload
                        else Raised({}, at_settled, 0)
                    )
                    found = raised.found
                    limit = max(self.spec.time_limit_s, BACKOFF_LIMIT_S)
                    if raised.fractions or not attempt(settled.fraction, limit):
                        # raised: the capacity test's plan, as a solve at those rates
                        # runs near its safety net (and could end either side of it)
                        assert found.plan is not None
                        out = Planned(
                            found.plan,
                            0.0,
                            solves,
                            min(raised.fractions.values(), default=settled.fraction),
                            None,
                            found.objective,
                            unproven,
                        )
            else:  # the same rule, each fraction decided by a solve (``out``: the last plan)

                def solved(at: float) -> Capacity:
                    if attempt(at):
                        assert out is not None
                        return Capacity(True, True, out.plan, out.objective)
                    return Capacity(True, not proved, None)

                settle_fraction(solved)
        overloaded = out is not None and out.plan is not None and out.served_fraction < 1.0
        if self.spec.fill_overload and overloaded:
            assert out is not None
            out = _filled(out, scaled(1.0), rates_rps, filled_plan)
        wall = time.perf_counter() - start
        if out is None:
            out = Planned(None, wall, solves, 0.0, unproven=unproven)
        else:
            out = replace(out, wall_s=wall, solves=solves, unproven=unproven)
        self._cache[key] = out
        return out


def _filled(
    out: Planned,
    problem: Problem,
    rates_rps: dict[str, float],
    fill: Callable[[Problem, Plan], Filled | None],
) -> Planned:
    """``out`` (a backed-off plan of ``problem``, the forecast ``rates_rps``) topped up
    by ``fill`` (``capacity.filled_plan``: the GPUs it leaves off, at their top
    clock, given to the workloads with the most forecast unserved), with the
    fraction of each workload's forecast it then serves; ``out`` with those
    fractions where nothing could be added."""
    assert out.plan is not None
    from energyopt.families.serving.remap import plan_rates_rps

    plan, objective, bound = out.plan, out.objective, out.bound
    routed = plan_rates_rps(plan)
    filled = fill(problem, plan)
    if filled is not None:
        plan, objective, bound, routed = filled.plan, filled.plan.objective, None, filled.served_rps
    served = {n: min(routed.get(n, 0.0) / r, 1.0) for n, r in rates_rps.items() if r > 0}
    least = min(served.values(), default=out.served_fraction)
    return Planned(
        plan,
        out.wall_s,
        out.solves,
        max(out.served_fraction, least),
        bound,
        objective,
        out.unproven,
        served,
    )


@dataclass(frozen=True)
class Raised:
    """Per-workload fractions of the forecast above a uniform back-off, and the
    capacity test's plan there."""

    fractions: dict[str, float]  # {} where no workload was raised
    found: Capacity  # the capacity test's answer at ``fractions`` (or the start's)
    tests: int  # capacity tests run


def raise_fractions(
    test: Callable[[dict[str, float]], Capacity],
    names: list[str],
    start: float,
    found: Capacity,
    top: float = 1.0,
) -> Raised:
    """Raise single workloads above the uniform fraction ``start`` the back-off
    settled on (no clock read): in rounds, each workload in ``names`` order in turn
    asks for its fraction plus ``RAISE_STEP`` (at most ``top``), the others held
    where they are, and keeps it where the capacity ``test`` packs a plan there;
    a workload refused once asks no more (the others only rise). So the capacity
    left where one workload limits a uniform fraction goes to the others,
    one step at a time each (at most len(names) x the steps above ``start`` tests).
    ``found``: the test's answer at ``start``."""
    steps = math.ceil((top - start) / RAISE_STEP - 1e-9)
    rungs = [min(start + RAISE_STEP * k, top) for k in range(1, steps + 1)]
    level = dict.fromkeys(names, start)
    stuck: set[str] = set()
    tests = 0
    raised = False
    while True:
        moved = False
        for name in names:
            if name in stuck:
                continue
            up = next((f for f in rungs if f > level[name] + 1e-12), None)
            if up is None:
                stuck.add(name)
                continue
            trial = {**level, name: up}
            answer = test(trial)
            tests += 1
            if answer.plan is None:
                stuck.add(name)
                continue
            level, found, moved, raised = trial, answer, True, True
        if not moved:
            break
    return Raised(level if raised else {}, found, tests)


def _ladder() -> list[float]:
    """The fractions of a forecast the planner backs off through: 1, BACKOFF^k up
    to BACKOFF_STEPS - 1, then halving DEEP_STEPS times."""
    steps = [BACKOFF**k for k in range(BACKOFF_STEPS)]
    return steps + [steps[-1] * DEEP_BACKOFF**k for k in range(1, DEEP_STEPS + 1)]


@dataclass(frozen=True)
class Settled:
    """The fraction the back-off settles on and the capacity test's plan there."""

    fraction: float  # 0.0: no fraction of the ladder passes
    plan: Plan | None
    objective: float | None
    undecided: bool = False
    """The least fraction tried above ``fraction`` is not proven infeasible: its LP
    relaxation serves every rate and packing found no plan there (a plan may exist)."""


def settle_fraction(test: Callable[[float], Capacity], *, with_top: bool = False) -> Settled | None:
    """The back-off rule (no clock read): walk the ladder (``_ladder``; from 1 where
    ``with_top``, else below 1) to the first fraction whose capacity ``test`` gives
    a plan; where that fraction was halved into (past the BACKOFF_STEPS fractions),
    bisect (geometric mean) REFINE_STEPS times between it and the ladder fraction
    above it, keeping the largest fraction with a plan. A fraction found on the
    first steps is kept as it is: a step below the largest fraction that packs,
    the integer solve there still has room (fleet-16 at 3.4-3.6 x its rates:
    branch-and-price proved 65.6 % optimal in 17 s; at 67.4 %, where the capacity
    test still packs, the back-off took 414 s at a load average of 4.8). None where
    the test does not apply (the configuration formulation does not)."""
    above = 1.0
    undecided = False  # the verdict on ``above`` (1 x the forecast: the solve's)
    ladder = _ladder()
    for k in range(0 if with_top else 1, len(ladder)):
        fraction = ladder[k]
        found = test(fraction)
        if not found.applies:
            return None
        if found.plan is None:
            above, undecided = fraction, found.lp_serves
            continue
        low, best = fraction, found
        high = above
        for _ in range(REFINE_STEPS if k >= BACKOFF_STEPS else 0):
            mid = (low * high) ** 0.5
            trial = test(mid)
            if trial.plan is not None:
                low, best = mid, trial
            else:
                high, undecided = mid, trial.lp_serves
        return Settled(low, best.plan, best.objective, undecided)
    return Settled(0.0, None, None, undecided)


class TablePlanner:
    """Plans by one lookup in a compiled plan table (``energyopt compile``).

    The table's ``load_scale`` axis is keyed by the largest ratio of forecast to
    base rate over the workloads (rounded up to the next grid value by the
    table). Tables with per-workload scale axes are not supported. Above the
    grid the largest cell is used and the planner reports the shortfall.
    """

    def __init__(self, spec: PlannerSpec, problem: Problem, table_path: Path) -> None:
        from energyopt.tables import Table

        self.spec = spec
        self.name = spec.name
        self.static = False
        self.table = Table.open(table_path)
        where = f"{table_path}"
        if self.table.kind != "plans":
            raise SpecError([f"{where}: a {self.table.kind} table, not a plan table"])
        version = self.table.meta.get("plans_version", 1)
        if version != PLANS_VERSION:
            raise SpecError(
                [
                    f"{where}: a plan table of version {version} (this energyopt reads "
                    f"version {PLANS_VERSION}: plans priced on the power line, limits on "
                    "the worst-case draw); compile it again with energyopt compile"
                ]
            )
        extra = [a for a in self.table.axes if a not in ("load_scale", "gpu", "unit")]
        if extra:
            raise SpecError([f"{where}: axes {extra} are not supported (load_scale only)"])
        gpus = [g.id for g in problem.gpus]
        if list(self.table.axes["gpu"].values) != gpus:
            raise SpecError([f"{where}: compiled for other GPUs than {problem.source}"])
        self.gpus = gpus
        self.types = {g.id: g.type for g in problem.gpus}
        self.units = [str(u) for u in self.table.axes["unit"].values]
        self.scales = [float(v) for v in self.table.axes["load_scale"].values]
        self.base_rates = {w.name: w.rate_rps for w in problem.instance.workloads}
        self.instance = problem.instance.name
        self.mig_names = [str(m) for m in self.table.meta.get("mig_profiles", [])]

    def plan(self, rates_rps: dict[str, float]) -> Planned:
        """The plan of the table cell that covers ``rates_rps``."""
        start = time.perf_counter()
        need = max(rates_rps[n] / r for n, r in self.base_rates.items())
        idx = int(self.table.axis_index("load_scale", [need])[0])
        fraction = 1.0
        if idx < 0:
            idx = len(self.scales) - 1
            fraction = self.scales[idx] / need
        plan = self._plan_at(idx)
        served = fraction if plan is not None else 0.0
        return Planned(plan, time.perf_counter() - start, 0, served)

    def _plan_at(self, idx: int) -> Plan | None:
        t = self.table
        if int(t.array("status")[idx]) not in (0, 1):
            return None
        on = t.array("on")[idx]
        clock = t.array("clock_mhz")[idx]
        limit = t.array("power_limit_w")[idx]
        power = t.array("predicted_power_w")[idx]
        share = t.array("share_pct")[idx]
        rate = t.array("rate_rps")[idx]
        tp_size = t.array("tp_size")[idx]
        tp_group = t.array("tp_group")[idx]
        mig = t.array("mig_profile")[idx]
        gpus: list[GpuPlan] = []
        for g, gid in enumerate(self.gpus):
            placements = []
            for u, label in enumerate(self.units):
                if int(share[g, u]) <= 0:
                    continue
                workload, _, phase = label.partition(":")
                placements.append(
                    Placement(
                        workload=workload,
                        phase=_phase(phase),
                        share_pct=int(share[g, u]),
                        mig_profile=self.mig_names[int(mig[g, u])] if mig[g, u] >= 0 else None,
                        rate_rps=float(rate[g, u]),
                        tp_group=f"tp{int(tp_group[g, u])}" if tp_group[g, u] >= 0 else None,
                        tp_size=max(int(tp_size[g, u]), 1),
                    )
                )
            gpus.append(
                GpuPlan(
                    gpu=gid,
                    type=self.types[gid],
                    on=bool(on[g]),
                    clock_mhz=int(clock[g]) if clock[g] >= 0 else None,
                    power_limit_w=None if math.isnan(limit[g]) else float(limit[g]),
                    placements=tuple(placements),
                    predicted_power_w=float(power[g]),
                )
            )
        objective = float(t.array("objective")[idx])
        bound = float(t.array("bound")[idx])
        return Plan(
            instance=self.instance,
            gpus=tuple(gpus),
            objective=None if np.isnan(objective) else objective,
            bound=None if np.isnan(bound) else bound,
            solver=f"table {self.table.path}",
            status="table",
        )


Planner = SolverPlanner | TablePlanner


def _phase(text: str) -> Phase:
    """A unit label's phase part ('' for a whole workload)."""
    if text == "prefill":
        return "prefill"
    if text == "decode":
        return "decode"
    return "both"


def make_planner(spec: PlannerSpec, problem: Problem, spec_path: str | Path) -> Planner | None:
    """The planner a spec entry names; None for a table planner whose file is absent
    (the evaluation then skips it and says so)."""
    if spec.kind == "table":
        assert spec.table is not None
        path = Path(spec.table)
        if not path.is_absolute():
            path = Path(spec_path).parent / path
        if not path.exists():
            return None
        return TablePlanner(spec, problem, path)
    preset = load_preset(spec.solver)
    return SolverPlanner(spec, problem, preset, static=spec.kind == "performance-first")
