"""Collectives (``kind: collective``): the communication schedule of every collective
of a trace (algorithm, protocol, chunks, channels, rank order, SM clock) for least
time or energy on a topology with degraded links and stragglers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from energyopt.families.collective.formulations.model import CollectiveProblem, load_collective
from energyopt.families.collective.spec import CollectiveFile, CollectivePlan
from energyopt.families.contract import NotExportable, SolverEntry, TableFamily
from energyopt.progress import Progress
from energyopt.solvers.result import Result, relative_gap
from energyopt.verify.violation import Violation

DEFAULT_TIME_LIMIT_S = 60.0


def _auto(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.synth import solve_synthesis

    limit = time_limit_s or DEFAULT_TIME_LIMIT_S
    return solve_synthesis(p, time_limit_s=limit, keep_better=True, progress=progress)


def _exact(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.exact import solve_exhaustive

    limit = time_limit_s or DEFAULT_TIME_LIMIT_S
    return solve_exhaustive(p, time_limit_s=limit, progress=progress)


def _select(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.select import solve_select

    return solve_select(p, time_limit_s=time_limit_s or DEFAULT_TIME_LIMIT_S, progress=progress)


def _milp(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.synth import solve_synthesis

    limit = time_limit_s or DEFAULT_TIME_LIMIT_S
    return solve_synthesis(p, time_limit_s=limit, progress=progress)


def _nccl(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.select import solve_nccl

    return solve_nccl(p, progress=progress)


def _ring(
    p: CollectiveProblem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[CollectivePlan]:
    from energyopt.families.collective.solvers.select import solve_ring

    return solve_ring(p, progress=progress)


class CollectiveFamily(TableFamily[CollectiveProblem, CollectivePlan]):
    """Collective-communication schedules chosen by the cluster's state."""

    kind = "collective"
    title = "collectives: communication schedules by topology, link health and stragglers"
    problem_model: type[BaseModel] = CollectiveFile
    plan_model: type[BaseModel] = CollectivePlan
    instances = ("instances/collective/*.yaml",)

    def load(self, path: str, catalogs: Sequence[str]) -> CollectiveProblem:
        return load_collective(path, catalogs)

    def summary(self, p: CollectiveProblem) -> str:
        h = p.spec.health
        obj = p.spec.objective
        objective = "time" if obj.kind == "time" else f"energy within {obj.max_time_ratio:g}x time"
        return (
            f"collective: {p.n} ranks on {p.n_nodes} node(s) of {p.gpu.name}, "
            f"{len(p.collectives)} collectives ({sum(c.count for c in p.collectives):,} runs), "
            f"{len(h.links)} degraded links, {len(h.stragglers)} stragglers, objective {objective}"
        )

    def show(self, p: CollectiveProblem) -> list[str]:
        r = p.rates
        lines = [
            self.summary(p),
            f"NVLink {r.nvlink_gbs:g} GB/s {r.nvlink_us:g} us; network {r.network_gbs:g} GB/s "
            f"{r.network_us:g} us; channel {r.channel_gbs:g} GB/s, reduce {r.reduce_gbs:g} GB/s, "
            f"launch {r.launch_us:g} us",
        ]
        for lh in p.spec.health.links:
            lines.append(f"degraded {lh.link} of {lh.gpu}: {lh.factor:g} of its bandwidth")
        for st in p.spec.health.stragglers:
            lines.append(f"straggler {st.gpu}: {st.slowdown:g}x slower")
        lines.append(f"{'collective':<20} {'op':<15} {'bytes':>13} {'count':>7}")
        for i, c in enumerate(p.collectives):
            lines.append(f"{p.name_of(i):<20} {c.op:<15} {c.bytes:>13,} {c.count:>7,}")
        return lines

    def solvers(self) -> list[SolverEntry[CollectiveProblem, CollectivePlan]]:
        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                "exhaustive search over the candidate schedules where the trace is small "
                "(else selection within the limit), and MILP synthesis up to 8 ranks; the better",
                ("time limit",),
                run=_auto,
            ),
            SolverEntry(
                "exact",
                self.kind,
                "certified bound",
                "exhaustive search over every candidate schedule, protocol and clock; "
                "each collective proven optimal where its least candidate meets the bound",
                ("time limit",),
                run=_exact,
            ),
            SolverEntry(
                "select",
                self.kind,
                "certified bound",
                "ring, tree, halving-doubling, hierarchical (rings or all-pairs inside nodes), "
                "direct x protocol x chunks x "
                "channels x clock on the cost model",
                run=_select,
            ),
            SolverEntry(
                "milp",
                self.kind,
                "certified bound",
                "time-expanded MILP synthesis with HiGHS (up to 8 ranks), else selection",
                ("time limit", "export"),
                run=_milp,
            ),
            SolverEntry(
                "nccl",
                self.kind,
                "certified bound",
                "NCCL 2.30.7's tuning model's algorithm, protocol and channels (Ring, Tree)",
                run=_nccl,
            ),
            SolverEntry(
                "ring",
                self.kind,
                "certified bound",
                "a fixed ring, Simple protocol, NCCL's channel count",
                run=_ring,
            ),
        ]

    def headline(self, p: CollectiveProblem) -> str:
        return f"{p.source} (collective, {p.n} ranks)"

    def verify(self, p: CollectiveProblem, plan: CollectivePlan) -> list[Violation]:
        from energyopt.families.collective.verify import evaluate_collective

        return evaluate_collective(p, plan).violations

    def cost(self, p: CollectiveProblem, plan: CollectivePlan) -> float:
        from energyopt.families.collective.verify import plan_cost

        return plan_cost(p, plan)

    def objective_unit(self, p: CollectiveProblem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return "J" if p.spec.objective.kind == "energy" else "us"

    def report(self, p: CollectiveProblem, result: Result[CollectivePlan]) -> list[str]:
        from energyopt.families.collective.solvers.select import collective_bound
        from energyopt.families.collective.verify import evaluate_collective

        plan = result.plan
        assert plan is not None
        ev = evaluate_collective(p, plan)
        energy = p.spec.objective.kind == "energy"
        unit = "J" if energy else "us"
        by_name = {p.name_of(i): c for i, c in enumerate(p.collectives)}
        lines = [f"collective plan for {p.spec.name} ({p.source})"]
        lines.append(
            f"{'collective':<20} {'algorithm':<17} {'proto':<6} {'chunks':>6} {'ch':>3} "
            f"{'MHz':>5} {'time us':>10} {'energy mJ':>10} {'gap':>7}"
        )
        for ch in plan.choices:
            got = (ev.energy_j if energy else ev.time_us).get(ch.collective, 0.0)
            c = by_name.get(ch.collective)
            gap = "" if c is None else f"{100 * relative_gap(got, collective_bound(p, c)):.1f}%"
            lines.append(
                f"{ch.collective:<20} {ch.algorithm:<17} {ch.protocol:<6} {ch.chunks:>6} "
                f"{ch.channels:>3} {ch.clock_mhz:>5} {ev.time_us.get(ch.collective, 0.0):>10,.2f} "
                f"{1e3 * ev.energy_j.get(ch.collective, 0.0):>10,.3f} {gap:>7}"
            )
        bound = "none" if result.bound is None else f"{result.bound:,.2f} {unit}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.2f}%"
        lines.append(
            f"gap per collective: its {'energy' if energy else 'time'} above its own lower "
            "bound (a collective is proven best only where its gap is 0); the trace's "
            "status and gap below are the count-weighted totals"
        )
        lines.append(
            f"trace: {ev.total_time_us:,.1f} us, {ev.total_energy_j:,.4f} J; objective "
            f"{result.objective:,.2f} {unit}, bound {bound}, gap {gap}, status {result.status}"
        )
        lines.extend(result.log)
        lines.append(f"solver {result.solver} ({result.algorithm}), {result.wall_s:.2f} s")
        return lines

    def exports(self, p: CollectiveProblem) -> Mapping[str, Callable[[str], None]]:
        """``csv``: the NCCL example tuner plugin's config for the file's topology,
        healthy (``tables.collective.write_healthy_tuner_conf``)."""
        from energyopt.families.collective.tables import write_healthy_tuner_conf

        return {"csv": lambda path: write_healthy_tuner_conf(p, path)}

    def program(self, p: CollectiveProblem) -> Any:
        """The synthesis MILP of the file's first collective (a HiGHS model)."""
        from energyopt.families.collective.formulations.synthesis import MAX_RANKS, build_milp
        from energyopt.families.collective.solvers.synth import ROUNDS

        if p.n > MAX_RANKS:
            raise NotExportable(
                f"the synthesis MILP takes at most {MAX_RANKS} ranks; this file has {p.n}"
            )
        return build_milp(p, p.collectives[0], min(ROUNDS, p.n - 1)).lp
