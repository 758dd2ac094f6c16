"""The configuration formulation's solver (``pattern`` exact, ``colgen`` as a
decomposition): root column generation, primal heuristics (residual packing, LP
dive), the integer master and, when exact, reduced-cost filtering
(docs/formulations/serving.md)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from energyopt.backends.pyomo_highs import MilpOutcome
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.backend import (
    ServingResult,
    finish_plan,
    plan_status,
    run_backend,
)
from energyopt.families.serving.solvers.highs_direct import padded_start
from energyopt.families.serving.solvers.lp_dive import lp_dive
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.families.serving.solvers.pattern_root import Root, solve_root
from energyopt.families.serving.solvers.residual_pack import TP_ROUND_UP_ABOVE, residual_pack
from energyopt.families.serving.solvers.restricted_master import (
    RESTRICTED_MASTER_COLUMNS,
    column_offsets,
    solve_restricted,
    with_start_columns,
)
from energyopt.formulations.errors import BackendFailure
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
    relative_gap,
    stop_reason,
)

FIRST_STAGE_SHARE = 0.3
FIRST_STAGE_MAX_S = 10.0
MAX_FILTERED_COLUMNS = 20_000
SLACK_STEPS = (0.2, 1.0)
LAZY_TP_UNITS = 1024
"""Above this many units, column generation as a decomposition prices the TP columns
of units that have single-GPU ops each round instead of listing them all at the
start (``pattern.prepare(..., lazy_tp=True)``); up to it (the bundled fleets) they
are listed as before."""
PACK_SHARE = 0.5
"""Part of the time left after the bounds past which residual packing tries no
further price scale (it had no share: at 102,400 GPUs it took 171 s and ended past
the deadline's reserve)."""
DIVE_SHARE = 0.3
"""Part of the time left after column generation that an LP dive may take."""


def _dive(
    prog: pat.PatternProgram, session: LpSession, deadline: float
) -> tuple[float, np.ndarray] | None:
    """(objective, integer-master values over ``prog``'s columns) of an LP dive in
    ``session`` (which holds a prefix of them; its count bounds stay changed)."""
    try:
        if not lp_dive(session, deadline):
            return None
    except BackendFailure:
        return None
    lp = session.solve()
    values = lp.x[len(session.mp.artificial) :]
    values[np.asarray(session.mp.z_var) - len(session.mp.artificial)] = np.round(
        lp.x[session.mp.z_var]
    )
    # Columns the program gained after the session's (residual packing's) at 0.
    return lp.objective, padded_start(values, int(column_offsets(prog)[-1]))


def _session(prog: pat.PatternProgram) -> LpSession:
    """The root LP of the configuration formulation, kept for the primal heuristics."""
    return LpSession(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)


def solve_configurations(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
    *,
    exact: bool = True,
) -> ServingResult:
    """Configuration formulation. ``exact``: finish with reduced-cost filtering so
    the integer solve covers every configuration that could improve the plan;
    otherwise (column generation as a decomposition) one integer solve over the
    generated columns, with the LP / unit bound as the certificate."""
    t0 = time.perf_counter()
    root: Root[LpSession] | None = solve_root(
        problem,
        table,
        note,
        colgen_deadline=t0 + 0.5 * (deadline - t0),
        deadline=deadline,
        exact_unit_bound=exact,
        make_session=_session,
        lazy_tp=not exact and len(table.units) > LAZY_TP_UNITS,
    )
    if root is None:
        return Result(INFEASIBLE, None, None, time.perf_counter() - t0, None, preset.name, [])
    prog, unit_bound, mix = root.prog, root.unit_bound, root.mix
    assert prog.lp is not None
    lp_bound = prog.lower_bound
    lower = max(lp_bound, unit_bound)
    note(
        f"bounds: LP {lp_bound:,.3f} after {prog.rounds} rounds ({len(prog.columns)} columns), "
        f"unit decomposition {unit_bound:,.3f} (share charge mix {mix:.2f}; "
        f"{time.perf_counter() - t0:.1f} s)"
    )
    best: tuple[float, dict[str, Any]] | None = None
    bound = lower
    z_root = prog.lp.x[np.asarray(root.session.mp.z_var if root.session else [], dtype=np.int64)]
    root_support = {int(j) for j in np.flatnonzero(z_root > 1e-9)}

    start: np.ndarray | None = None
    cuts = list(root.time_cut)

    def integer_solve(
        limit_s: float, *, whole: bool = False, bound_needed: bool = False
    ) -> MilpOutcome:
        """The integer master over the generated columns; ``whole``: never over the
        restricted set (its bound must hold for every generated column);
        ``bound_needed``: its bound will be used (CP-SAT computes one only then)."""
        nonlocal best, start
        if preset.backend == "highs":
            im = pat.integer_model(prog, pyomo=False)
            # As a decomposition, a large master (RESTRICTED_MASTER_COLUMNS) with a
            # plan to start from is solved over the root LP's columns and the plan's.
            picked = (
                with_start_columns(prog, root_support, start)
                if not exact
                and not whole
                and start is not None
                and len(prog.columns) >= RESTRICTED_MASTER_COLUMNS
                else list(range(len(prog.columns)))
            )
            out, values = solve_restricted(
                prog,
                picked,
                start,
                time_limit_s=max(0.5, limit_s),
                # As a decomposition, the integer solve's own gap is relative to
                # the generated columns only: run on until the certified gap
                # (stop_at) or the time limit.
                rel_gap=gap if exact else min(gap, 1e-4),
                threads=preset.threads,
                progress=note,
                stop_at=lower / (1.0 - gap) if gap < 1 else None,
                certified_bound=lower,
                max_nodes=preset.exact_nodes if exact else preset.mip_nodes,
            )
            if out.time_limited:
                cuts.append("integer solve")
            im.values = values
        else:
            im = pat.integer_model(prog)
            out = run_backend(
                im.model,
                preset,
                time_limit_s=max(0.5, limit_s),
                rel_gap=gap,
                progress=note,
                bound=bound_needed,
            )
            if out.time_limited:
                cuts.append("integer solve")
        if out.objective is not None and (best is None or out.objective < best[0] - 1e-9):
            best = (out.objective, pat.decisions(prog, im))
            if im.values is not None:
                start = im.values
        return out

    if preset.backend == "highs" and not pat.is_small(prog):
        # Two incumbents for the integer solve to start from: residual packing (one
        # LP solve; the better one on large fleets) and the LP dive (one LP solve per
        # rounding step; often the better one on small ones), which is skipped when
        # the packing is already within the target gap.
        assert root.session is not None
        pack_deadline = time.perf_counter() + PACK_SHARE * (deadline - time.perf_counter())
        found: list[tuple[str, tuple[float, np.ndarray] | None]] = [
            (
                "residual packing",
                residual_pack(
                    root.session,
                    prog,
                    tp_round_up_above=TP_ROUND_UP_ABOVE,
                    deadline=pack_deadline,
                ),
            )
        ]
        if time.perf_counter() >= pack_deadline:
            cuts.append("residual packing")
        packed = found[0][1]
        if packed is None or relative_gap(packed[0], lower) > gap:
            dive_deadline = time.perf_counter() + DIVE_SHARE * (deadline - time.perf_counter())
            found.append(("LP dive", _dive(prog, root.session, dive_deadline)))
            if found[-1][1] is None and time.perf_counter() >= dive_deadline:
                cuts.append("LP dive")
        for what, plan in found:
            if plan is None:
                note(f"{what}: no plan")
                continue
            note(f"{what}: plan {plan[0]:,.3f} (gap {relative_gap(plan[0], lower):.3%})")
            if best is None or plan[0] < best[0] - 1e-9:
                im = pat.integer_model(prog, pyomo=False)
                im.values = plan[1]
                best, start = (plan[0], pat.decisions(prog, im)), plan[1]
        if len(found) == 1:
            note("LP dive: skipped (residual packing is within the target gap)")
    left = deadline - time.perf_counter()
    out: MilpOutcome | None = None
    if best is not None and relative_gap(best[0], lower) <= gap:
        note("the first plan is within the target gap of the certified bound")
    else:
        # with node limits on the exact solves (preset.exact_nodes) they end each
        # stage, and the time left is only the safety net
        shared = exact and preset.exact_nodes is None
        out = integer_solve(min(FIRST_STAGE_SHARE * left, FIRST_STAGE_MAX_S) if shared else left)
    if best is not None:
        note(
            f"integer plan over {len(prog.columns)} generated columns: {best[0]:,.3f} "
            f"(gap {relative_gap(best[0], lower):.3%})"
        )
    # Any plan better than `best` uses only columns whose reduced cost is at most
    # best - LP bound. Widen the column set towards that slack; once all of them
    # are in and the integer solve is optimal, its bound holds for the whole problem.
    over_limit = False  # the filter's column limit ended the search (not the time)
    for frac in SLACK_STEPS:
        if best is not None and relative_gap(best[0], lower) <= gap:
            break
        if time.perf_counter() > deadline - 0.5:
            cuts.append("reduced-cost filter")
            break
        full = best[0] - lp_bound if best is not None else float("inf")
        slack = frac * full if frac < 1.0 and best is not None else full
        if not prog.enumerated:
            # Knapsack-priced configurations cannot be listed: no filter; the rest
            # of the time goes to the integer solve over the generated columns.
            note("reduced-cost filter: configurations are priced, not listed; solving on")
            if best is not None and (out is None or out.status != OPTIMAL):
                integer_solve(deadline - time.perf_counter())
            break
        extra = pat.columns_within(prog, slack, limit=MAX_FILTERED_COLUMNS)
        # With no plan yet the slack is unbounded: this step already takes every
        # column, so it is the last, with all the time left (at 80 % and then a
        # second solve from scratch, fleet-16 with one workload at ten times its
        # rate found no plan in a 15-s limit; the one solve finds it in 9 s).
        complete = extra is not None and (frac >= 1.0 or math.isinf(slack))
        for col in extra or []:
            prog.add(col)
        note(
            f"reduced-cost filter: {len(extra or [])} more columns within {slack:,.3f}"
            + (
                ""
                if extra is not None
                else f" (more than {MAX_FILTERED_COLUMNS:,}: skipped; the search stops here)"
            )
        )
        if extra is None:
            over_limit = True
            break
        share = 1.0 if complete or preset.exact_nodes is not None else 0.8
        # Whole: the bound of this solve is the problem's only if it saw every
        # column within the slack (a restricted master's bound holds for its own
        # columns alone).
        out = integer_solve(
            share * (deadline - time.perf_counter()), whole=True, bound_needed=complete
        )
        if complete and out.status == INFEASIBLE and best is None:
            return Result(INFEASIBLE, None, None, time.perf_counter() - t0, None, preset.name, [])
        # (CP-SAT's bound is its relaxation's, valid for the exact master too.)
        if complete and out.bound is not None and best is not None:
            bound = max(lower, min(out.bound, best[0]))
        if best is not None:
            note(f"best plan {best[0]:,.3f} (gap {relative_gap(best[0], bound):.3%})")
        if complete:
            break
    wall = time.perf_counter() - t0
    if best is None:
        return Result(NO_SOLUTION, None, bound, wall, None, preset.name, [])
    objective, decisions = best
    status = plan_status(FEASIBLE, objective, bound, gap)
    plan = finish_plan(problem, table, decisions, status, objective, bound, preset.name)
    # above the gap, colgen stopped on the integer solve's node limit; the exact
    # stage on its time share, or on the filter's column limit
    termination = stop_reason(
        cuts,
        relative_gap(objective, bound) <= gap,
        note,
        otherwise=(
            Termination.TIME_LIMIT
            if exact and not over_limit and preset.exact_nodes is None
            else Termination.EFFORT_LIMIT
        ),
    )
    return Result(status, objective, bound, wall, plan, preset.name, [], termination=termination)
