"""Serverless disaggregated serving (``kind: serverless``): prefill and decode
instances of each model provisioned jointly per epoch, with the KV transfer
between them, at least GPU-seconds, energy or a weighted sum."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from energyopt.families.contract import SolverEntry, SolverRun, TableFamily, given
from energyopt.families.serverless.formulations.model import ServerlessProblem, load_serverless
from energyopt.families.serverless.spec import ServerlessFile, ServerlessPlan
from energyopt.families.serverless.verify import ServerlessEvaluation, evaluate_serverless
from energyopt.progress import Progress
from energyopt.solvers.result import FEASIBLE, INFEASIBLE, NO_SOLUTION, Result, Termination
from energyopt.verify.violation import Violation

AUTO_MILP_POOLS = 20_000
"""``auto`` solves the whole-horizon MILP up to this many pools, else the LP bound."""
MAX_PROGRAM_COLUMNS = 5_000_000
"""``milp`` and ``lp`` build no program with more columns (memory: about 1 KB each
with HiGHS); the fast plan is returned then, with no bound."""
BUILD_COLUMNS_PER_S = 400_000.0
"""Columns built and handed to HiGHS per second (about 1.5 million measured on one
core); a program is built only when that takes at most half the time left."""
RESERVE_FRACTION = 0.05
"""Share of the time limit kept for reading back and checking the program's plan
(at least twice the time the fast plan's check took)."""
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = 1e-4
EVALUATIONS_KEPT = 8


def auto_solver(p: ServerlessProblem) -> str:
    """The solver ``auto`` runs on ``p``: milp up to ``AUTO_MILP_POOLS`` pools, else lp."""
    from energyopt.families.serverless.formulations.milp import program_size

    return "milp" if program_size(p)[0] <= AUTO_MILP_POOLS else "lp"


def _rolling(
    p: ServerlessProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[ServerlessPlan]:
    from energyopt.families.serverless.solvers.milp import solve_rolling

    limit, gap = time_limit_s or DEFAULT_TIME_LIMIT_S, given(rel_gap, DEFAULT_GAP)
    return solve_rolling(p, time_limit_s=limit, rel_gap=gap, progress=progress)


class ServerlessFamily(TableFamily[ServerlessProblem, ServerlessPlan]):
    """Joint prefill/decode provisioning of serverless LLM functions."""

    kind = "serverless"
    title = "serverless: prefill and decode instances per epoch, KV transfer, cold starts"
    problem_model: type[BaseModel] = ServerlessFile
    plan_model: type[BaseModel] = ServerlessPlan
    instances = ("instances/serverless/*.yaml",)
    plan_states_unit = True

    def __init__(self) -> None:
        self._seen: dict[
            tuple[int, ServerlessPlan], tuple[ServerlessProblem, ServerlessEvaluation]
        ] = {}

    def load(self, path: str, catalogs: Sequence[str]) -> ServerlessProblem:
        return load_serverless(path, list(catalogs))

    def summary(self, p: ServerlessProblem) -> str:
        return (
            f"serverless: {p.n_models} models, {p.n_nodes} nodes of {p.gpu.name} "
            f"({int(p.node_gpus.sum())} GPUs), {p.n_epochs} epochs of {p.epoch_s:g} s, "
            f"{p.n_options} instance options, objective {p.spec.objective.kind}"
        )

    def show(self, p: ServerlessProblem) -> list[str]:
        lines = [self.summary(p)]
        lines.append(
            f"{'model':<18} {'LLM':<16} {'peak rps':>8} {'mean rps':>8} {'KV MB/req':>9} "
            f"{'NVLink ms':>9} {'net ms':>7}  SLO"
        )
        for m, sm in enumerate(p.spec.models):
            lines.append(
                f"{sm.name:<18} {sm.model:<16} {p.demand[m].max():>8.2f} "
                f"{p.demand[m].mean():>8.2f} {p.kv_request_bytes[m] / 1e6:>9.1f} "
                f"{1e3 * p.transfer_s[m, 0]:>9.3f} {1e3 * p.transfer_s[m, 1]:>7.2f}  "
                f"p{sm.slo.percentile:g} TTFT {sm.slo.ttft_ms:g} ms, TBT {sm.slo.tbt_ms:g} ms"
            )
        lines.append(f"{'option':<20} " + " ".join(f"{sm.name[:14]:>30}" for sm in p.spec.models))
        lines.append(
            f"{'share/tp/clock':<20} "
            + " ".join(f"{'prefill nv/net, decode rps':>30}" for _ in p.spec.models)
        )
        for o, opt in enumerate(p.options):
            cells = " ".join(
                f"{p.cap_prefill[m, o, 0]:>9.2f} {p.cap_prefill[m, o, 1]:>9.2f} "
                f"{p.cap_decode[m, o]:>10.2f}"
                for m in range(p.n_models)
            )
            lines.append(f"{f'{opt.share_pct}%/{opt.tp}/{opt.clock_mhz}':<20} {cells}")
        return lines

    def solvers(self) -> list[SolverEntry[ServerlessProblem, ServerlessPlan]]:
        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                f"milp up to {AUTO_MILP_POOLS:,} pools, else lp",
                pick=auto_solver,
            ),
            SolverEntry(
                "milp",
                self.kind,
                "exact",
                "whole-horizon joint prefill/decode MILP with HiGHS; at a time limit, "
                "its plan or the fast plan, whichever costs less",
                ("time limit", "gap", "export"),
                run=self._program("milp"),
            ),
            SolverEntry(
                "lp",
                self.kind,
                "certified bound",
                "LP relaxation bound; plan: its counts rounded up or the fast plan, "
                "whichever costs less",
                ("time limit",),
                run=self._program("lp"),
            ),
            SolverEntry(
                "fast",
                self.kind,
                "heuristic",
                "per-phase SLO-capacity provisioning, then coupling on nodes; no bound",
                run=self._fast,
            ),
            SolverEntry(
                "rolling",
                self.kind,
                "heuristic",
                "one epoch's MILP at a time from the instances kept; no bound",
                ("time limit",),
                run=_rolling,
            ),
        ]

    def headline(self, p: ServerlessProblem) -> str:
        return f"{p.source} (serverless, {p.n_models} models)"

    def _fast(
        self,
        p: ServerlessProblem,
        time_limit_s: float | None,
        rel_gap: float | None,
        progress: Progress,
    ) -> Result[ServerlessPlan]:
        from energyopt.families.serverless.solvers.fast import solve_fast

        limit, gap = time_limit_s or DEFAULT_TIME_LIMIT_S, given(rel_gap, DEFAULT_GAP)
        return self._checked(p, solve_fast(p, time_limit_s=limit, rel_gap=gap, progress=progress))

    def _program(self, chosen: str) -> SolverRun[ServerlessProblem, ServerlessPlan]:
        """What runs ``chosen``: milp or lp."""

        def run(
            p: ServerlessProblem,
            time_limit_s: float | None,
            rel_gap: float | None,
            progress: Progress,
        ) -> Result[ServerlessPlan]:
            return self._solve_program(p, chosen, time_limit_s, rel_gap, progress)

        return run

    def _solve_program(
        self,
        p: ServerlessProblem,
        chosen: str,
        time_limit_s: float | None,
        rel_gap: float | None,
        progress: Progress,
    ) -> Result[ServerlessPlan]:
        """The whole-horizon MILP (``chosen`` milp) or its LP relaxation (lp), built
        only where it fits the time left; the fast plan kept where it costs less."""
        from energyopt.families.serverless.formulations.milp import program_size
        from energyopt.families.serverless.solvers.fast import solve_fast
        from energyopt.families.serverless.solvers.milp import solve_milp, solve_relaxation
        from energyopt.families.serverless.solvers.result import serverless_result

        t0 = time.perf_counter()
        limit, gap = time_limit_s or DEFAULT_TIME_LIMIT_S, given(rel_gap, DEFAULT_GAP)

        def left() -> float:
            """Seconds of the time limit still to spend."""
            return limit - (time.perf_counter() - t0)

        columns = program_size(p)[1]
        # The fast plan (milliseconds) is kept where it costs less than the
        # program's: HiGHS' incumbent at a time limit, or the LP's counts rounded up.
        fast = solve_fast(p, time_limit_s=left(), rel_gap=gap, progress=progress)
        checking = time.perf_counter()
        fast = self._checked(p, fast)
        # what reading back and checking the program's plan will take
        reserve = max(RESERVE_FRACTION * limit, 2.0 * (time.perf_counter() - checking))
        budget = left() - reserve
        if columns > MAX_PROGRAM_COLUMNS or columns / BUILD_COLUMNS_PER_S > budget / 2:
            result = serverless_result(
                NO_SOLUTION,
                chosen,
                time.perf_counter() - t0,
                log=[
                    f"the {chosen} program would have {columns:,} columns: not built "
                    f"({budget:.1f} s of the time limit left, at most "
                    f"{MAX_PROGRAM_COLUMNS:,} columns); no bound"
                ],
                termination=Termination.TIME_LIMIT,
                algorithm="none: the program is too large for the time limit",
            )
        elif chosen == "milp":
            # an exact plan that the verifier rejects is the solver's failure: the
            # family contract reports it (no silent substitution)
            result = solve_milp(p, time_limit_s=budget, rel_gap=gap, progress=progress)
        else:
            result = self._checked(
                p, solve_relaxation(p, time_limit_s=budget, rel_gap=gap, progress=progress)
            )
        if (
            fast.plan is not None
            and result.status is not INFEASIBLE
            and (
                result.plan is None
                or (
                    not self.verify(p, result.plan)
                    and self.cost(p, fast.plan) < self.cost(p, result.plan)
                )
            )
        ):
            what = "HiGHS branch and cut" if chosen == "milp" else "LP relaxation"
            if result.algorithm.startswith("none"):
                what = "no"
            had = "no plan" if result.plan is None else f"{self.cost(p, result.plan):,.3f}"
            result.log.append(
                f"the fast algorithm's plan ({self.cost(p, fast.plan):,.3f}) costs less "
                f"than the {chosen} plan ({had}): kept, with the {chosen} bound"
            )
            progress(result.log[-1])
            result.plan, result.objective, result.status = fast.plan, fast.objective, FEASIBLE
            result.algorithm = f"{what} bound; plan from the fast algorithm"
        elif result.plan is None and fast.plan is None:
            result.log.extend(fast.log)
        result.wall_s = time.perf_counter() - t0
        return result

    def _checked(
        self, p: ServerlessProblem, result: Result[ServerlessPlan]
    ) -> Result[ServerlessPlan]:
        """``result`` without its plan when the plan breaks a constraint its heuristic
        does not model (a power cap, a rounded-up count's TTFT), the reason logged."""
        if result.plan is None:
            return result
        broken = self.verify(p, result.plan)
        if broken:
            result.log.append(f"{result.solver}: plan dropped: {broken[0]}")
            result.plan, result.objective, result.status = None, None, NO_SOLUTION
        return result

    def verify(self, p: ServerlessProblem, plan: ServerlessPlan) -> list[Violation]:
        return self._evaluate(p, plan).violations

    def cost(self, p: ServerlessProblem, plan: ServerlessPlan) -> float:
        return self._evaluate(p, plan).cost

    def _evaluate(self, p: ServerlessProblem, plan: ServerlessPlan) -> ServerlessEvaluation:
        """The verifier's evaluation, kept for the last few (problem, plan) pairs: the
        contract asks for violations and cost separately, and both need it whole."""
        key = (id(p), plan)
        found = self._seen.get(key)
        if found is None or found[0] is not p:
            found = (p, self._evaluate_now(p, plan))
            self._seen[key] = found
            while len(self._seen) > EVALUATIONS_KEPT:
                self._seen.pop(next(iter(self._seen)))
        return found[1]

    def _evaluate_now(self, p: ServerlessProblem, plan: ServerlessPlan) -> ServerlessEvaluation:
        from energyopt.catalog.loader import Catalog

        catalog = Catalog(
            {p.gpu.name: p.gpu},
            {sm.model: llm for sm, llm in zip(p.spec.models, p.llms, strict=True)},
        )
        return evaluate_serverless(p.spec, catalog, plan)

    def objective_unit(self, p: ServerlessProblem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return p.unit

    def report(self, p: ServerlessProblem, result: Result[ServerlessPlan]) -> list[str]:
        plan = result.plan
        assert plan is not None
        ev = self._evaluate(p, plan)
        lines = [f"serverless plan for {p.spec.name} ({p.source})"]
        lines.append(f"{'epoch':>5} " + " ".join(f"{sm.name[:18]:>22}" for sm in p.spec.models))
        for ep in plan.epochs:
            cells = []
            for sm in p.spec.models:
                pre = sum(x.count for x in ep.pools if x.model == sm.name and x.phase == "prefill")
                dec = sum(x.count for x in ep.pools if x.model == sm.name and x.phase == "decode")
                net = sum(
                    r.rate_rps
                    for r in ep.routes
                    if r.model == sm.name and r.prefill_node != r.decode_node
                )
                cells.append(f"{f'{pre}P {dec}D net {net:.1f}':>22}")
            lines.append(f"{ep.epoch:>5} " + " ".join(cells))
        lines.append(
            f"GPU-seconds {ev.gpu_s:,.1f} (of which loading {ev.load_gpu_s:,.1f}, {ev.starts} "
            f"cold starts; draining {ev.drain_gpu_s:,.1f}, {ev.stops} decode stops), energy "
            f"{ev.energy_j / 3.6e6:.4f} kWh, KV over the network {ev.network_bytes / 1e9:,.1f} GB"
        )
        bound = "none" if result.bound is None else f"{result.bound:,.2f}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
        lines.append(
            f"objective {result.objective:,.2f} {p.unit}, bound {bound}, gap {gap}, "
            f"status {result.status}"
        )
        lines.append(f"solver {result.solver} ({result.algorithm}), {result.wall_s:.2f} s")
        return lines

    def program(self, p: ServerlessProblem) -> Any:
        """The whole-horizon MILP the ``milp`` solver solves (a HiGHS model)."""
        from energyopt.families.serverless.formulations.milp import build_milp, highs_lp

        return highs_lp(build_milp(p))
