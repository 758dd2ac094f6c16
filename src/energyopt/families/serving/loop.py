"""The planning loop: every epoch, forecast the load from the recent past, ask the
planner for a plan, check it, and apply it in the simulator."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from energyopt.catalog.problem import Problem, load_problem
from energyopt.families.serving.planners import Planner, SolverPlanner, make_planner
from energyopt.families.serving.remap import plan_rates_rps, problem_at_plan_rates, stabilize
from energyopt.families.serving.solvers.replan import replan as replan_now
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.online import ErrorHeadroom, OnlineConfig, OnlinePolicy, OpLookups
from energyopt.online.attainment import plan_reserves
from energyopt.online.local_scheduler import LocalConfig
from energyopt.online.surprise import SurpriseConfig, SurpriseDetector
from energyopt.perf.params import FloatArray
from energyopt.perf.power import gpu_on_power_w
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.engine import SimResult, Simulator
from energyopt.sim.forecast import (
    burst_peak_rps,
    expected_rates_rps,
    peak_rates_rps,
    planned_rates_rps,
    raw_rates_rps,
)
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import synthetic_arrivals
from energyopt.sim.trace import trace_arrivals
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import (
    Evaluation,
    Forecast,
    PlannerSpec,
    TraceLoad,
    resolve_relative,
)
from energyopt.spec.plan import Plan
from energyopt.spec.workload import MAX_TOKEN_CV

Say = Callable[[str], None]


class PlanningError(RuntimeError):
    """A planner has no plan for the initial load."""


@dataclass
class Tally:
    """What a planner did over the run."""

    solver_s: list[float] = field(default_factory=list)  # wall time of each planning call
    solves: int = 0
    shortfall_epochs: int = 0  # planned for less than the forecast (fleet too small)
    unproven_shortfall_epochs: int = 0  # of those: more not proven infeasible (Planned.unproven)
    unplanned_epochs: int = 0  # no plan: the previous one kept
    time_limited_plans: int = 0  # epoch plans of a solve its time limit cut (not repeatable)
    rejected_plans: int = 0  # plans the verifier rejected at their planned load
    predicted_j: float = 0.0  # the planners' own power figures times epoch lengths
    predicted_static_j: float = 0.0  # of which the on-GPUs' power at their clocks, idle
    # the same plans' power on the model at the rates that arrived while each was in
    # force (no forecast error): predicted_j - this is the forecast's part of the gap
    predicted_arrivals_j: float = 0.0
    # the same plans' power at the load each epoch was expected to carry (the
    # forecast's mean rate, forecast.expected_rates_rps; a static plan: the
    # horizon's mean), not the peak with headroom the plans are sized for
    predicted_expected_j: float = 0.0
    headroom: list[list[float]] = field(default_factory=list)  # per epoch, per workload
    planned_rps: list[list[float]] = field(default_factory=list)  # per plan asked, per workload
    surprise_replans: int = 0  # plans made at once on a surprise (online planners)
    surprise_fallbacks: int = 0  # of those: the full warm-started solve, not the restricted one
    surprise_failed: int = 0  # surprises that found no plan (the one in force kept)
    surprise_s: list[float] = field(default_factory=list)  # wall time of each surprise re-plan
    consolidations: int = 0  # plans made at once on a drop below the lower band, applied
    consolidations_declined: int = 0  # of the drops re-planned: not paying their transitions
    consolidations_failed: int = 0  # drops that found no plan
    consolidation_s: list[float] = field(default_factory=list)  # wall time of each re-plan
    consolidation_saved_j: float = 0.0  # predicted saving until the next epoch, applied ones
    consolidation_cost_j: float = 0.0  # their transition energy (consolidation_transition_j)


@dataclass
class PlannerRun:
    """One planner's evaluation: the simulation and the planner's tally."""

    name: str
    kind: str
    result: SimResult
    tally: Tally

    @property
    def solver_s(self) -> list[float]:
        """Wall time of each planning call (s)."""
        return self.tally.solver_s

    @property
    def solver_s_per_epoch(self) -> float:
        """Mean planning wall time per epoch (s)."""
        return float(np.mean(self.solver_s)) if self.solver_s else 0.0


@dataclass
class EvaluationResult:
    """Every planner's run on one load."""

    evaluation: Evaluation
    problem: Problem
    arrivals: Arrivals
    runs: list[PlannerRun]
    skipped: list[str]
    failed: list[str]


def _say_nothing(_: str) -> None:
    return None


def build_arrivals(ev: Evaluation, problem: Problem, spec_path: str | Path) -> Arrivals:
    """The requests of the evaluation's load."""
    workloads = problem.instance.workloads
    if isinstance(ev.load, TraceLoad):
        return trace_arrivals(
            resolve_relative(spec_path, ev.load.file),
            workloads,
            start_s=ev.load.start_s,
            duration_s=ev.duration_s,
            load_scale=ev.load.load_scale,
            tokens=ev.load.tokens,
            seed=ev.seed,
        )
    return synthetic_arrivals(ev.load, workloads, ev.duration_s, ev.seed)


def planning_problem(problem: Problem, arrivals: Arrivals) -> Problem:
    """``problem`` with each workload's mean prompt and output tokens, and the spread
    of its prompts (``TokenDist.cv``), set to those of its requests (a deployment knows
    its traffic's token statistics; the queueing model prices a long-prompt tail
    through the spread, docs/performance-model.md §4)."""
    prompt, output = arrivals.mean_tokens()
    spread = np.minimum(np.nan_to_num(arrivals.prompt_cv(), nan=0.0), MAX_TOKEN_CV)
    workloads = []
    for k, w in enumerate(problem.instance.workloads):
        if not np.isfinite(prompt[k]):
            workloads.append(w)
            continue
        workloads.append(
            w.model_copy(
                update={
                    "prompt_tokens": w.prompt_tokens.model_copy(
                        update={"mean": float(prompt[k]), "max": None, "cv": float(spread[k])}
                    ),
                    "output_tokens": w.output_tokens.model_copy(
                        update={"mean": float(output[k]), "max": None}
                    ),
                }
            )
        )
    inst = problem.instance.model_copy(update={"workloads": tuple(workloads)})
    return problem.with_instance(inst)


def online_policy(ev: Evaluation, lookups: OpLookups) -> OnlinePolicy:
    """The online control the evaluation's ``online:`` block configures."""
    o = ev.online
    # every threshold the spec and the scheduler share, by name (the spec's other
    # options configure the forecast, the local scheduler and the re-plans)
    shared = {f.name for f in fields(OnlineConfig)} & set(type(o).model_fields)
    config = OnlineConfig(**{name: getattr(o, name) for name in sorted(shared)})
    local = LocalConfig(protect_tbt=o.protect_tbt)
    return OnlinePolicy(lookups, config, o.local, local, o.max_chunk)


def run_planner(
    ev: Evaluation,
    problem: Problem,
    arrivals: Arrivals,
    planner: Planner,
    tables: PassTables,
    say: Say = _say_nothing,
    record: bool = False,
    lookups: OpLookups | None = None,
) -> PlannerRun:
    """Simulate ``planner`` on ``arrivals`` over the evaluation window. A planner with
    ``online: true`` runs the online control (``lookups``: its operating-point
    table, built from ``problem`` when None) and sizes its forecasts with
    headroom from the observed forecast error (online/headroom.py)."""
    base = np.asarray([w.rate_rps for w in problem.instance.workloads])
    names = [w.name for w in problem.instance.workloads]
    fc = ev.forecast
    window = ev.duration_s
    run = Tally()
    current: list[Plan | None] = [None]
    current_at: list[Problem] = [problem]  # the problem ``current`` was priced on
    since = [0.0]
    online = planner.spec.online and not planner.static
    policy: OnlinePolicy | None = None
    errors: ErrorHeadroom | None = None
    last_raw: list[tuple[float, np.ndarray]] = []
    if planner.spec.online:
        lookups = lookups or OpLookups.build(problem)
        policy = online_policy(ev, lookups)
    if online:
        errors = ErrorHeadroom(
            len(names),
            quantile=ev.online.error_quantile,
            epochs=ev.online.error_epochs,
            default=fc.headroom,
            max_headroom=ev.online.max_headroom,
            min_headroom=ev.online.min_headroom,
        )
        if policy is not None:  # the harvest margins follow the same errors
            policy = replace(policy, errors=errors)
    unit = fc.model_copy(update={"headroom": 1.0})
    detector: SurpriseDetector | None = None
    if online and ev.online.replan_on_surprise and isinstance(planner, SolverPlanner):
        detector = SurpriseDetector(
            len(names),
            SurpriseConfig(
                surprise_s=ev.online.surprise_s,
                cooldown_s=ev.online.surprise_cooldown_s,
                window_s=ev.online.surprise_window_s,
            ),
        )
    drop: SurpriseDetector | None = None
    if online and ev.online.consolidate_on_drop and isinstance(planner, SolverPlanner):
        drop = SurpriseDetector(
            len(names),
            SurpriseConfig(
                surprise_s=ev.online.consolidate_s,
                cooldown_s=ev.online.consolidate_cooldown_s,
                window_s=ev.online.surprise_window_s,
            ),
        )
    last_drop = [-np.inf]  # s: when the last consolidation was tried
    lead = epoch_lead_s(ev, problem) if not planner.static else 0.0
    expected_now: list[dict[str, float]] = [{}]  # the load the epoch's plan should carry
    expected_at: list[dict[str, float]] = [{}]  # that of the plan in force

    sims: list[Simulator] = []  # the simulator, once built (its guard factors)

    def decide(now: float, raw: np.ndarray) -> Plan | None:
        if errors is not None:
            if last_raw:
                t0, before = last_raw[-1]
                errors.record(before, arrivals.window_rates_rps(t0, now, fc.window_s))
            last_raw.append((now, raw))
            headroom = errors.headroom()
            run.headroom.append(headroom.tolist())
            sized = raw * headroom
            o = ev.online
            ctl = sims[0].ctl if sims else None  # no outcome before the first plan
            factors = ctl.guard_factors() if ctl is not None else None
            reserve = plan_reserves(len(names), o.tail_reserve, o.guard_reserve, factors)
            if reserve.max() > 0:  # the plan reaches the recent burst peak
                peak = burst_peak_rps(
                    arrivals, now, ev.epoch_s, fc, window, o.tail_window_s, o.tail_quantile
                )
                sized = np.maximum(sized, reserve * peak)
            rates = planned_rates_rps(sized, base, unit)
        else:
            rates = planned_rates_rps(raw, base, fc)
        run.planned_rps.append(rates.tolist())
        planned = planner.plan(dict(zip(names, rates.tolist(), strict=True)))
        run.solver_s.append(planned.wall_s)
        run.solves += planned.solves
        if planned.plan is None:
            run.unplanned_epochs += 1
            say(f"{planner.name}: t={now:.0f} s: no plan; keeping the current one")
            return None
        if planned.time_limited:
            run.time_limited_plans += 1
            say(
                f"{planner.name}: t={now:.0f} s: the plan's solve stopped on its time limit "
                "(a rerun on a busier or quieter machine may plan otherwise)"
            )
        if planned.served_fraction < 1.0 - 1e-9:
            run.shortfall_epochs += 1
            run.unproven_shortfall_epochs += int(planned.unproven)
            say(
                f"{planner.name}: t={now:.0f} s: planned for "
                f"{100 * planned.served_fraction:.0f} % of the forecast ("
                + (
                    "no plan for more found; one may exist)"
                    if planned.unproven
                    else "the next fraction up is infeasible)"
                )
            )
        # checked, kept in place and priced on the problem the planner solved: a
        # latency margin lowers every op's capacity, so its power line and its
        # worst-case draw (the power limit the plan sets)
        own = planner.problem if isinstance(planner, SolverPlanner) else problem
        at = problem_at_plan_rates(own, planned.plan)
        if verify_plan(at, planned.plan):
            run.rejected_plans += 1
        plan = stabilize(at, planned.plan, current[0])
        adopt(now, plan, at)
        expected_at[0] = expected_now[0]  # after adopt: close() prices the old plan on its own
        return plan

    def adopt(now: float, plan: Plan, at: Problem) -> Plan:
        """Put ``plan`` (priced on ``at``) in force at ``now`` (s): the energy of the
        plan it replaces is added up to ``now`` and the detectors get its bands."""
        close(now)
        current[0] = plan
        current_at[0] = at
        since[0] = now
        watch_plan(plan)
        return plan

    def watch_plan(plan: Plan) -> None:
        """Give the surprise detector the bands of ``plan``: its rate per workload times
        1 + the workload's error spread (``ErrorHeadroom.spread``); and the drop
        detector its lower bands (``drop_band``)."""
        if errors is None:
            return
        routed = plan_rates_rps(plan)
        rates = [routed.get(n, 0.0) for n in names]
        if detector is not None:
            detector.set_plan(rates, errors.spread())
        if drop is not None:
            band = drop_band(errors.spread(), ev.online.consolidate_below)
            band[~errors.known()] = 1.0  # no band before the load's swings are known
            drop.set_plan(rates, None, band)

    def watched(now: float) -> Plan | None:
        """The watch between epochs: a re-plan on an upward surprise, else a
        consolidation on a drop (None: neither)."""
        out = surprise(now)
        if out is None and drop is not None:
            out = consolidate(now)
        return out

    def consolidate(now: float) -> Plan | None:
        """On a drop (a workload below its lower band for ``consolidate_s``), a
        warm-started re-plan of every workload whose consolidation rate
        (``consolidation_rates_rps``) is below what the plan routes to it; applied
        only when it has fewer GPUs on than the plan in force and the power it saves
        until the next epoch (``consolidation_saving_j``: the model's, both plans at
        the new rates) exceeds its transition energy (``consolidation_transition_j``).
        None when nothing fires or the re-plan is not applied."""
        plan = current[0]
        if drop is None or errors is None or plan is None:
            return None
        o = ev.online
        span = drop.config.window_s
        if now < span:
            return None
        fired = drop.update(now, arrivals.count_between(now - span, now) / span)
        if not fired or now - last_drop[0] < o.consolidate_cooldown_s - 1e-9:
            return None
        last_drop[0] = now
        end = min(window, next_epoch_s(now, ev.epoch_s, lead))
        if end <= now:
            return None
        seen = min(now, span + o.consolidate_s)
        observed = arrivals.count_between(now - seen, now) / seen
        peak = np.zeros(len(names))
        if o.consolidate_keeps_peak and o.burst_memory_s > 0:
            start = max(0.0, (np.floor(now / o.burst_memory_s) - 1.0) * o.burst_memory_s)
            ratio = burst_ratio(arrivals, start, now, o.burst_tau_s, fc.window_s)
            peak = ratio * observed
        routed = plan_rates_rps(plan)
        reach = np.ones(len(names))  # top-clock capacity over the planned rate, in force
        if peak.any() and lookups is not None:
            top = top_capacity_rps(lookups, plan)
            reach = np.asarray(
                [
                    max(top.get(n, 0.0) / routed[n], 1.0) if routed.get(n, 0.0) > 0 else 1.0
                    for n in names
                ]
            )
        want = consolidation_rates_rps(
            observed, seen, errors.spread(), peak / reach, base * fc.floor, drop.config.noise_z
        )
        known = errors.known()
        rates = {
            n: float(want[k])
            for k, n in enumerate(names)
            if known[k] and 0.0 < want[k] < routed.get(n, 0.0) * (1.0 - 1e-6)
        }
        if not rates:
            return None
        own = planner.problem if isinstance(planner, SolverPlanner) else problem
        preset = planner.preset if isinstance(planner, SolverPlanner) else "highs-exact"
        wall = 0.0
        short: list[str] = []
        for _ in range(CONSOLIDATION_TRIES):
            out = replan_now(
                own,
                plan,
                rates,
                preset=preset,
                migration_penalty_w=CONSOLIDATION_PENALTY_W,
                full_time_limit_s=planner.spec.time_limit_s,
            )
            wall += out.wall_s
            if out.plan is None or out.power_w is None or not peak.any() or lookups is None:
                break
            # the boosts must still reach each re-planned workload's burst peak: where
            # they do not, ask again for that much more (not above the plan in force)
            top = top_capacity_rps(lookups, out.plan)
            need = {n: peak[k] for k, n in enumerate(names) if n in rates}
            short = sorted(n for n, p in need.items() if top.get(n, 0.0) < p * (1 - 1e-6))
            for n in short:
                rates[n] *= need[n] / max(top.get(n, 0.0), 1e-9)
                if rates[n] >= routed[n] * (1.0 - 1e-6):
                    del rates[n]
            if not short or not rates:
                break
        run.consolidation_s.append(wall)
        if out.plan is None or out.power_w is None:
            run.consolidations_failed += 1
            say(f"{planner.name}: t={now:.0f} s: drop on {sorted(rates)}: no plan")
            return None
        if short:
            run.consolidations_declined += 1
            say(
                f"{planner.name}: t={now:.0f} s: drop: re-plan leaves the burst peak of "
                f"{short} above its top-clock capacity: kept the plan"
            )
            return None
        saved_j = consolidation_saving_j(current_at[0], plan, out.plan, out.power_w, end - now)
        cost_j = consolidation_transition_j(own, ev, plan, out.plan)
        on_before = sum(gp.on for gp in plan.gpus)
        on_after = sum(gp.on for gp in out.plan.gpus)
        if saved_j <= cost_j or on_after >= on_before:
            run.consolidations_declined += 1
            say(
                f"{planner.name}: t={now:.0f} s: drop on {sorted(rates)}: re-plan saves "
                f"{saved_j / 1e3:.1f} kJ until t={end:.0f} s, its transitions cost "
                f"{cost_j / 1e3:.1f} kJ, GPUs on {on_before} -> {on_after}: kept the plan"
            )
            return None
        run.consolidations += 1
        run.consolidation_saved_j += saved_j
        run.consolidation_cost_j += cost_j
        say(
            f"{planner.name}: t={now:.0f} s: drop on {sorted(rates)}: consolidated "
            f"({out.method}, GPUs on {on_before} -> {on_after}, saves {saved_j / 1e3:.1f} kJ "
            f"for {cost_j / 1e3:.1f} kJ of transitions, {wall:.2f} s)"
        )
        return adopt(now, out.plan, problem_at_plan_rates(own, out.plan))

    def surprise(now: float) -> Plan | None:
        """A warm-started re-plan for the workloads whose surprise fires at ``now``
        (solvers/replan.py), each at its observed rate over the detector's window
        times its headroom; None when none fires or no plan is found."""
        plan = current[0]
        if detector is None or errors is None or plan is None:
            return None
        span = detector.config.window_s
        if now < span:
            return None
        observed = arrivals.count_between(now - span, now) / span
        fired = detector.update(now, observed)
        if not fired:
            return None
        routed = plan_rates_rps(plan)
        headroom = errors.headroom()
        rates = {
            names[k]: max(routed.get(names[k], 0.0), float(observed[k] * headroom[k]))
            for k in fired
        }
        own = planner.problem if isinstance(planner, SolverPlanner) else problem
        preset = planner.preset if isinstance(planner, SolverPlanner) else "highs-exact"
        out = replan_now(
            own, plan, rates, preset=preset, full_time_limit_s=planner.spec.time_limit_s
        )
        run.surprise_s.append(out.wall_s)
        if out.plan is None:
            run.surprise_failed += 1
            say(f"{planner.name}: t={now:.0f} s: surprise on {sorted(rates)}: no plan")
            watch_plan(plan)
            return None
        run.surprise_replans += 1
        run.surprise_fallbacks += int(out.method == "full")
        say(
            f"{planner.name}: t={now:.0f} s: surprise on {sorted(rates)}: re-planned "
            f"({out.method}, {len(out.changed_gpus)} GPUs changed, {out.wall_s:.2f} s)"
        )
        return adopt(now, out.plan, problem_at_plan_rates(own, out.plan))

    def close(now: float) -> None:
        """Add the plan in force since ``since`` to the predicted energies."""
        plan = current[0]
        if plan is None or now <= since[0]:
            return
        span = now - since[0]
        run.predicted_j += _power_w(plan) * span
        run.predicted_static_j += _static_w(problem, plan) * span
        came = arrivals.count_between(since[0], now) / span
        true = dict(zip(names, came.tolist(), strict=True))
        run.predicted_arrivals_j += plan_power_at_rates_w(current_at[0], plan, true) * span
        expected = expected_at[0]
        run.predicted_expected_j += plan_power_at_rates_w(current_at[0], plan, expected) * span

    if planner.static:
        first_raw = peak_rates_rps(arrivals, window, fc)
        mean = arrivals.count_between(0.0, window).astype(np.float64) / window
    else:
        first_raw = raw_rates_rps(arrivals, 0.0, ev.epoch_s, fc, window)
        mean = expected_rates_rps(arrivals, 0.0, ev.epoch_s, fc, window)
    expected_now[0] = dict(zip(names, mean.tolist(), strict=True))
    first = decide(0.0, first_raw)
    if first is None:
        raise PlanningError(f"{planner.name}: no plan for the initial load")
    sim = Simulator(
        problem,
        arrivals,
        window_s=window,
        drain_s=ev.drain_s,
        transitions=ev.transitions,
        colocation_slowdown=ev.colocation_slowdown,
        bin_s=ev.power_bin_s,
        record=record,
        tables=tables,
        online=policy,
    )
    sims.append(sim)

    def replan(now: float) -> Plan | None:
        say(f"{planner.name}: re-planning at t={now:.0f} s")
        mean = expected_rates_rps(arrivals, now, ev.epoch_s, fc, window, lead)
        expected_now[0] = dict(zip(names, mean.tolist(), strict=True))
        return decide(now, raw_rates_rps(arrivals, now, ev.epoch_s, fc, window, lead))

    watching = detector is not None or drop is not None
    watch = (ev.online.surprise_check_s, watched) if watching else None
    epoch = None if planner.static else ev.epoch_s
    result = sim.run(first, epoch, replan, watch, epoch_lead_s=lead)
    close(window)
    return PlannerRun(planner.name, planner.spec.kind, result, run)


CONSOLIDATION_PENALTY_W = 1.0
"""Migration penalty of a consolidation re-plan (W-equivalent per placement taken off
its GPU): only a tie-break towards keeping placements where they are. The re-plan
must be free to take the placements off the GPUs it switches off (the surprise
re-plan's default penalty, about an H100's on-power, kept them on, idle); what the
moves cost is priced by the acceptance rule (``consolidation_transition_j``)."""


def drop_band(spread: FloatArray, below: float) -> FloatArray:
    """The drop detector's lower band per workload, as a fraction of the planned rate
    under it (``SurpriseDetector.set_plan``'s ``lower``): a workload is below its band
    when its observed rate times 1 + its error ``spread`` (the margin a consolidation
    plans with, ``consolidation_rates_rps``) is below ``1 - below`` times its planned
    rate, i.e. when a plan made now would route at least ``below`` less to it. The
    fraction is ``1 - (1 - below) / (1 + spread)``."""
    if not 0.0 <= below < 1.0:
        raise ValueError(f"below {below} is not in [0, 1)")
    return np.asarray(1.0 - (1.0 - below) / (1.0 + np.asarray(spread, dtype=np.float64)))


CONSOLIDATION_TRIES = 3
"""Re-plans one consolidation may make: when a re-plan leaves a workload's burst peak
above its top-clock capacity (``top_capacity_rps``), its rate is raised by that
shortfall and the re-plan asked again, at most this many times in all."""


def burst_ratio(
    arrivals: Arrivals, start_s: float, end_s: float, burst_s: float, window_s: float
) -> FloatArray:
    """Per workload, the highest rate of a ``burst_s``-second window over the median
    rate of the ``window_s``-second windows, both over the complete ``window_s``
    windows of [``start_s``, ``end_s``) (s): how far above its typical level the
    workload's bursts went (at least 1; 1 where nothing arrived or no window is
    complete). A consolidation keeps capacity within reach of the boosts for that
    burst again at the current level. Measured against the window holding it
    instead, a burst as long as the window (bursty's 30-s bursts) is its own level."""
    per = max(1, round(window_s / burst_s))
    whole = int((end_s - start_s) // (per * burst_s))
    ones = np.ones(len(arrivals.names))
    if whole <= 0:
        return ones
    span = whole * per * burst_s
    short = arrivals.window_rates_rps(start_s, start_s + span, burst_s)[: whole * per]
    level = np.median(arrivals.window_rates_rps(start_s, start_s + span, per * burst_s), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(level > 0, short.max(axis=0) / level, 1.0)
    return np.asarray(np.maximum(ratios, ones))


def top_capacity_rps(lookups: OpLookups, plan: Plan) -> dict[str, float]:
    """Per workload, what ``plan``'s placements of it serve within the SLO at the
    highest candidate clock of their GPU type, at their shares (req/s): the rate the
    online control's boosts can reach without a new plan (``OpLookups.capacity_rps``;
    a placement's planned rate where that is more, or where the table has no entry:
    tensor-parallel, MIG and decode placements)."""
    out: dict[str, float] = defaultdict(float)
    for gp in plan.gpus:
        if not gp.on:
            continue
        clocks = lookups.clocks.get(gp.type, ())
        for p in gp.placements:
            if p.phase == "decode":
                continue
            cap = 0.0
            if clocks and p.tp_group is None and p.mig_profile is None:
                label = p.workload if p.phase == "both" else f"{p.workload}:{p.phase}"
                cap = lookups.capacity_rps(label, gp.type, max(clocks), p.share_pct)
            out[p.workload] += max(cap, p.rate_rps)
    return dict(out)


def consolidation_rates_rps(
    observed_rps: FloatArray,
    span_s: float,
    margin: FloatArray,
    peak_rps: FloatArray,
    floor_rps: FloatArray,
    noise_z: float,
) -> FloatArray:
    """Per workload, the rate (req/s) a consolidation plans for: the rate observed over
    the last ``span_s`` seconds plus ``noise_z`` standard deviations of its Poisson
    noise there (sqrt(rate / span)), times 1 + its ``margin`` (the harvest margin,
    ``ErrorHeadroom.spread``: how far a window's rate rises above the typical one), at
    least its burst-memory peak ``peak_rps`` (zeros: none) and ``floor_rps`` (the
    forecast's floor)."""
    if span_s <= 0:
        raise ValueError(f"span_s {span_s} is not > 0")
    obs = np.asarray(observed_rps, dtype=np.float64)
    noisy = obs + noise_z * np.sqrt(obs / span_s)
    return np.asarray(np.maximum(np.maximum(noisy * (1.0 + margin), peak_rps), floor_rps))


def consolidation_saving_j(
    problem: Problem, old: Plan, new: Plan, new_power_w: float, rest_s: float
) -> float:
    """The energy (J) a consolidation saves over ``rest_s`` seconds (until the next
    epoch): the model's power of ``old`` (priced on ``problem``, the problem it was
    made for) at the rates ``new`` routes (``plan_power_at_rates_w``) less
    ``new_power_w`` (``new``'s power at those rates, W), times ``rest_s``. Negative
    when ``new`` draws more."""
    return (plan_power_at_rates_w(problem, old, plan_rates_rps(new)) - new_power_w) * rest_s


def consolidation_transition_j(problem: Problem, ev: Evaluation, old: Plan, new: Plan) -> float:
    """The energy (J) the move from ``old`` to ``new`` costs beyond what both plans draw
    while serving, as the simulator charges it (``ev.transitions``): a GPU switched on
    draws its idle power for ``power_on_s``, then its on-power at the new clock while
    its instances start (``startup_s`` + the heaviest of its models' weights /
    ``load_gbps``), serving nothing; a GPU switched off draws its on-power at its old
    clock until the requests it admitted finish, taken as the longest of its
    workloads' TTFT SLO + mean output tokens x TBT SLO. New instances on a GPU on in
    both plans cost no energy here (the GPU draws its power either way; the re-plan's
    migration penalty prices the move)."""
    tr = ev.transitions
    before = {gp.gpu: gp for gp in old.gpus}
    after = {gp.gpu: gp for gp in new.gpus}
    workloads = {w.name: w for w in problem.instance.workloads}
    total = 0.0
    for g in problem.gpus:
        was, now = before.get(g.id), after.get(g.id)
        on_before = was is not None and was.on
        on_after = now is not None and now.on
        gtype = problem.gpu_type(g.type)
        if on_after and not on_before:
            assert now is not None
            clock = now.clock_mhz or gtype.max_sm_clock_mhz
            heaviest = max(
                (
                    problem.model_of(workloads[p.workload]).weight_bytes / p.tp_size
                    for p in now.placements
                ),
                default=0.0,
            )
            load_s = tr.instance_start_s(heaviest)
            total += gtype.idle_w * tr.power_on_s + gpu_on_power_w(gtype, clock) * load_s
        elif on_before and not on_after:
            assert was is not None
            clock = was.clock_mhz or gtype.max_sm_clock_mhz
            drain_s = max(
                (
                    (
                        workloads[p.workload].slo.ttft_ms
                        + workloads[p.workload].output_tokens.mean
                        * workloads[p.workload].slo.tbt_ms
                    )
                    / 1e3
                    for p in was.placements
                ),
                default=0.0,
            )
            total += gpu_on_power_w(gtype, clock) * drain_s
    return total


def _power_w(plan: Plan) -> float:
    return sum(gp.predicted_power_w for gp in plan.gpus)


def plan_power_at_rates_w(problem: Problem, plan: Plan, rates_rps: dict[str, float]) -> float:
    """The model's power (W) of ``plan`` when its workloads' requests arrive at
    ``rates_rps`` (req/s) instead of the rates it routes: every placement's rate
    scaled by its workload's arrivals over its planned rate (the simulator routes in
    proportion to the planned rates), priced by the verifier on the power lines of
    ``problem``, the problem the plan was made for (on-power of each GPU that is on,
    plus each placement's line at its scaled rate, 0 at rate 0)."""
    planned = plan_rates_rps(plan)
    factor = {
        name: rates_rps.get(name, 0.0) / rate if rate > 0 else 0.0
        for name, rate in planned.items()
    }
    gpus = tuple(
        gp.model_copy(
            update={
                "placements": tuple(
                    pl.model_copy(
                        update={"rate_rps": pl.rate_rps * factor.get(pl.workload, 0.0)}
                    )
                    for pl in gp.placements
                )
            }
        )
        for gp in plan.gpus
    )
    return evaluate_plan(problem, plan.model_copy(update={"gpus": gpus})).total_power_w


def _static_w(problem: Problem, plan: Plan) -> float:
    """The part of ``_power_w`` that does not depend on the load: each on GPU's
    power at its locked clock with nothing running (W)."""
    return sum(
        gpu_on_power_w(problem.gpu_type(gp.type), gp.clock_mhz)
        for gp in plan.gpus
        if gp.on and gp.clock_mhz is not None
    )


def evaluate(
    ev: Evaluation,
    spec_path: str | Path,
    *,
    only: list[str] | None = None,
    say: Say = _say_nothing,
    catalogs: list[str] | None = None,
) -> EvaluationResult:
    """Run every planner of ``ev`` (or those named in ``only``) on its load."""
    base_path = resolve_relative(spec_path, ev.base)
    if not base_path.exists():
        raise SpecError([f"{spec_path}: base: no such file {base_path}"])
    problem = load_problem(base_path, catalogs or ())
    arrivals = build_arrivals(ev, problem, spec_path)
    say(
        f"{len(arrivals)} requests over {ev.duration_s:g} s "
        f"({len(arrivals) / ev.duration_s:.2f} req/s)"
    )
    planning = planning_problem(problem, arrivals)
    specs = [p for p in ev.planners if only is None or p.name in only]
    online = any(p.online for p in specs)
    tables = PassTables(planning, ev.online.max_chunk if online else 0)
    lookups = OpLookups.build(planning) if online else None
    if only is not None:
        unknown = sorted(set(only) - {p.name for p in ev.planners})
        if unknown:
            names = ", ".join(p.name for p in ev.planners)
            raise SpecError([f"--planner: unknown planner(s) {unknown}; the spec has {names}"])
    runs: list[PlannerRun] = []
    skipped: list[str] = []
    failed: list[str] = []
    for i, spec in enumerate(specs):
        try:
            planner = make_planner(spec, planning, spec_path)
        except SpecError as exc:
            raise SpecError(
                [f"{spec_path}: planners[{i}]({spec.name}): {p}" for p in exc.problems]
            ) from None
        if planner is None:
            skipped.append(f"{spec.name}: table {spec.table} not found")
            say(f"{spec.name}: skipped (table {spec.table} not found)")
            continue
        say(f"{spec.name}: simulating")
        try:
            runs.append(run_planner(ev, planning, arrivals, planner, tables, say, lookups=lookups))
        except PlanningError as exc:
            failed.append(str(exc))
            say(str(exc))
    return EvaluationResult(ev, planning, arrivals, runs, skipped, failed)


CLAIRVOYANT_WINDOW_S = 30.0
"""The clairvoyant yardstick re-plans every this many seconds (s)."""

CLAIRVOYANT = PlannerSpec(name="clairvoyant", kind="energyopt", solver="highs-exact")
"""The yardstick's planner: energyopt's joint planner (exact preset)."""

CLAIRVOYANT_ONLINE = PlannerSpec(
    name="clairvoyant+online", kind="energyopt", solver="highs-exact", online=True
)
"""The covering yardstick's planner: the same, under energyopt's online control."""

COVER_RATE_WINDOW_S = 10.0
"""The covering yardstick sizes each plan for the highest rate over windows of this
many seconds (s): a 30-s window's mean hides the bursts inside it."""


def plan_lead_s(ev: Evaluation, problem: Problem) -> float:
    """The longest time (s) from a plan's start until one of its new instances serves,
    in ``ev``'s simulator: a GPU switched on (``power_on_s``), then the serving
    process started (``startup_s``) and the largest of ``problem``'s models loaded on
    one GPU (weights / ``load_gbps``). Until then the plan before it serves."""
    tr = ev.transitions
    heaviest = max(problem.model_of(w).weight_bytes for w in problem.instance.workloads)
    return tr.power_on_s + tr.instance_start_s(heaviest)


def epoch_lead_s(ev: Evaluation, problem: Problem) -> float:
    """How long (s) before each epoch's boundary its plan is made and applied: the
    plan lead (``plan_lead_s``: its new instances then serve from the boundary) with
    ``ev.plan_ahead``, else 0. Raises SpecError when the lead is not shorter than
    the epoch."""
    if not ev.plan_ahead:
        return 0.0
    lead = plan_lead_s(ev, problem)
    if lead >= ev.epoch_s:
        raise SpecError(
            [f"plan_ahead: the plan lead {lead:.1f} s is not shorter than epoch_s {ev.epoch_s:g} s"]
        )
    return lead


def next_epoch_s(now_s: float, epoch_s: float, lead_s: float = 0.0) -> float:
    """When (s) the next epoch's plan is applied after ``now_s``: the first boundary
    k x ``epoch_s`` (k >= 1) whose plan, made ``lead_s`` before it, comes after
    ``now_s``; that plan's time, k x ``epoch_s`` - ``lead_s``."""
    k = max(1.0, np.floor((now_s + lead_s) / epoch_s + 1e-9) + 1.0)
    return float(k * epoch_s - lead_s)


def clairvoyant_evaluation(
    ev: Evaluation,
    window_s: float = CLAIRVOYANT_WINDOW_S,
    rate_window_s: float | None = None,
    lookahead_s: float = 0.0,
) -> Evaluation:
    """``ev`` as the clairvoyant yardstick runs it: a plan every ``window_s`` seconds for
    the rates that arrive in that window (the oracle forecast: by default the window's
    requests counted over its length; with ``rate_window_s`` the highest rate over
    windows of that many seconds, and with ``lookahead_s`` also over that many
    seconds after the window, until the next plan serves), with no headroom and no
    rounding beyond 1e-6 of each base rate; a workload with no request in a window
    is planned at 1e-3 of its base rate (the floor every forecast has)."""
    fc = Forecast(
        method="oracle",
        window_s=rate_window_s or window_s,
        headroom=1.0,
        quantum=1e-6,
        floor=1e-3,
        lookahead_s=lookahead_s,
    )
    return ev.model_copy(update={"epoch_s": window_s, "forecast": fc, "plan_ahead": False})


def run_clairvoyant(
    res: EvaluationResult,
    spec: PlannerSpec = CLAIRVOYANT,
    window_s: float = CLAIRVOYANT_WINDOW_S,
    say: Say = _say_nothing,
    *,
    rate_window_s: float | None = None,
    lookahead_s: float = 0.0,
) -> PlannerRun:
    """The clairvoyant yardstick on ``res``'s load: ``spec`` (an energyopt planner)
    re-planned every ``window_s`` seconds with each window's true arrival rates
    (``clairvoyant_evaluation`` with ``rate_window_s`` and ``lookahead_s``), replayed
    in the simulator on the same requests as every planner of ``res``, transitions
    and all. With ``spec.online`` the plans run under the online control of
    ``res``'s evaluation, as energyopt+online's do: the run then differs from that
    planner only in knowing the load ahead. No deployable planner knows the coming
    window's rates; how far it falls short of this run is what forecasting costs.
    Raises PlanningError when there is no plan for the first window."""
    if spec.kind != "energyopt":
        raise ValueError(f"the yardstick plans with an energyopt planner, not {spec.kind}")
    ev = clairvoyant_evaluation(res.evaluation, window_s, rate_window_s, lookahead_s)
    planner = make_planner(spec, res.problem, ".")
    assert planner is not None  # a solver planner always exists
    if not spec.online:
        return run_planner(ev, res.problem, res.arrivals, planner, PassTables(res.problem, 0), say)
    tables = PassTables(res.problem, ev.online.max_chunk)
    lookups = OpLookups.build(res.problem)
    return run_planner(ev, res.problem, res.arrivals, planner, tables, say, lookups=lookups)


def run_covering_clairvoyant(res: EvaluationResult, say: Say = _say_nothing) -> PlannerRun:
    """The covering yardstick: energyopt+online's planner and online control, re-planned
    every ``CLAIRVOYANT_WINDOW_S`` seconds for the highest ``COVER_RATE_WINDOW_S`` rate
    that arrives from the plan's start until the next plan serves (``plan_lead_s``
    after the window). It plans with the knowledge the plain yardstick has, and
    covers what a window's mean hides: the bursts inside it and the time the next
    plan takes to come up."""
    return run_clairvoyant(
        res,
        CLAIRVOYANT_ONLINE,
        say=say,
        rate_window_s=COVER_RATE_WINDOW_S,
        lookahead_s=plan_lead_s(res.evaluation, res.problem),
    )
