"""MoE edge serving (``kind: moe-edge``): each expert of a mixture-of-experts model
resident on a GPU, fetched from host memory or run on the CPU, the dense part's GPU
and the GPUs' clocks, for least energy per token (or least time under a power cap)
within memory and the TBT/TTFT SLOs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from energyopt.catalog.loader import bind_catalog
from energyopt.families.contract import (
    LimitedSolver,
    NotExportable,
    SolverEntry,
    TableFamily,
    limited,
)
from energyopt.families.moe_edge.formulations.model import (
    MoeEdgeProblem,
    load_moe_edge,
    objective_unit,
)
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan
from energyopt.families.moe_edge.verify import MoeEvaluation, evaluate_moe_edge
from energyopt.solvers.result import Result
from energyopt.verify.violation import Violation

AUTO_MILP_COLUMNS = 20_000
"""``auto`` runs the exact MILP while configurations x columns stay below this."""
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = 1e-4


def auto_solver(p: MoeEdgeProblem) -> str:
    """The solver ``auto`` runs on ``p``: milp while configurations x columns stay
    below ``AUTO_MILP_COLUMNS``, else lagrangian."""
    size = p.n_canonical_configs() * p.n_items * p.n_options
    return "milp" if size < AUTO_MILP_COLUMNS else "lagrangian"


def _solvers() -> dict[str, LimitedSolver[MoeEdgeProblem, MoeEdgePlan]]:
    """The moe-edge solver functions by entry name (imported on first use)."""
    from energyopt.families.moe_edge.solvers import lagrangian, milp

    return {"milp": milp.solve_milp, "lagrangian": lagrangian.solve_lagrangian}


class MoeEdgeFamily(TableFamily[MoeEdgeProblem, MoeEdgePlan]):
    """Sparsity-aware expert placement, offloading and clocks on an edge server."""

    kind = "moe-edge"
    title = "moe-edge: MoE experts on GPUs, fetched from host or on the CPU; clocks"
    problem_model: type[BaseModel] = MoeEdgeFile
    plan_model: type[BaseModel] = MoeEdgePlan
    instances = ("instances/moe-edge/*.yaml",)

    def load(self, path: str, catalogs: Sequence[str]) -> MoeEdgeProblem:
        return load_moe_edge(path, catalogs)

    def _eval(self, p: MoeEdgeProblem, plan: MoeEdgePlan) -> MoeEvaluation:
        catalog, _ = bind_catalog()
        catalog = catalog.merged(list(p.gpus), [p.model])
        return evaluate_moe_edge(p.spec, catalog, plan)

    def summary(self, p: MoeEdgeProblem) -> str:
        gpus = ", ".join(f"{g.name} ({g.type})" for g in p.spec.server.gpus)
        slo = p.spec.slo
        obj = p.spec.objective
        what = (
            "energy per token"
            if obj.kind == "energy"
            else f"time per token, cap {obj.power_cap_w:g} W"
        )
        return (
            f"moe-edge: {p.model.name} ({p.n_layers} layers x {p.n_experts} experts, top-"
            f"{p.model.experts_per_token}, {p.expert_gb * 1e3:.1f} MB each) on {gpus}; "
            f"TBT p{slo.percentile:g} <= {slo.tbt_ms:g} ms; objective {what}"
        )

    def show(self, p: MoeEdgeProblem) -> list[str]:
        lines = [self.summary(p), f"activations: {p.spec.activations.source}"]
        lines.append(f"{'GPU':<10} {'type':<8} {'memory GB':>9} {'PCIe GB/s':>9}  clocks MHz")
        for g, gpu in zip(p.spec.server.gpus, p.gpus, strict=True):
            mem = g.memory_gb if g.memory_gb is not None else gpu.memory_gb
            clocks = ", ".join(str(c) for c in p.clock_options[p.spec.server.gpus.index(g)])
            lines.append(f"{g.name:<10} {gpu.name:<8} {mem:>9g} {g.pcie_gbps:>9g}  {clocks}")
        top = p.freq.max(axis=1) / p.model.experts_per_token
        lines.append(
            f"most-selected expert per layer takes {100 * top.min():.1f}..{100 * top.max():.1f} % "
            f"of the layer's selections; batch {p.spec.batch}, context {p.spec.context_tokens}"
        )
        return lines

    def solvers(self) -> list[SolverEntry[MoeEdgeProblem, MoeEdgePlan]]:
        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                f"milp while configurations x columns < {AUTO_MILP_COLUMNS:,}, else lagrangian",
                pick=auto_solver,
            ),
            SolverEntry(
                "milp",
                self.kind,
                "exact",
                "placement MILP per configuration (dense GPU, clocks) with HiGHS",
                ("time limit", "gap", "export"),
                run=limited(_solvers, "milp", DEFAULT_TIME_LIMIT_S, DEFAULT_GAP),
            ),
            SolverEntry(
                "lagrangian",
                self.kind,
                "certified bound",
                "Lagrangian bound (memory and SLO priced) + transportation repair",
                ("time limit", "gap"),
                run=limited(_solvers, "lagrangian", DEFAULT_TIME_LIMIT_S, DEFAULT_GAP),
            ),
        ]

    def headline(self, p: MoeEdgeProblem) -> str:
        return f"{p.source} (moe-edge, {p.n_items} experts)"

    def verify(self, p: MoeEdgeProblem, plan: MoeEdgePlan) -> list[Violation]:
        return self._eval(p, plan).violations

    def cost(self, p: MoeEdgeProblem, plan: MoeEdgePlan) -> float:
        return self._eval(p, plan).cost

    def objective_unit(self, p: MoeEdgeProblem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return objective_unit(p.spec)

    def report(self, p: MoeEdgeProblem, result: Result[MoeEdgePlan]) -> list[str]:
        plan = result.plan
        assert plan is not None
        ev = self._eval(p, plan)
        clocks = ", ".join(f"{n} {c} MHz" for n, c in plan.clocks_mhz.items())
        lines = [
            f"moe-edge plan for {p.spec.name} ({p.source}): dense part on "
            f"{plan.dense_gpu}; {clocks}"
        ]
        places = ", ".join(f"{k} {v}" for k, v in ev.counts.items())
        lines.append(f"experts: {places}")
        mem = ", ".join(f"{k} {v:.2f} GB" for k, v in ev.gpu_used_gb.items())
        lines.append(f"memory: {mem}; host {ev.host_used_gb:.2f} GB")
        lines.append(
            f"step {ev.mean_ms:.2f} ms mean (sd {ev.sd_ms:.2f}), TBT p{p.spec.slo.percentile:g} "
            f"<= {ev.tbt_bound_ms:.2f} ms (limit {p.spec.slo.tbt_ms:g}); "
            f"{ev.energy_per_token_j:.3f} J/token, {ev.power_w:.1f} W, "
            f"PCIe {ev.pcie_gb_per_token:.3f} GB/token"
        )
        unit = objective_unit(p.spec)
        bound = "none" if result.bound is None else f"{result.bound:.6g} {unit}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
        lines.append(
            f"objective {result.objective:.6g} {unit}, bound {bound}, gap {gap}, "
            f"status {result.status}"
        )
        lines.append(f"solver {result.solver} ({result.algorithm}), {result.wall_s:.2f} s")
        return lines

    def program(self, p: MoeEdgeProblem) -> Any:
        """The relaxed (secant) placement MILP of the max-clock configuration with the
        dense part on the first GPU, as a HiGHS model; the exact solver solves one per
        configuration."""
        from energyopt.families.moe_edge.formulations.milp import build_milp, secant, v_max

        c = p.costs(p.max_clock_config())
        if c.gpu_free_gb[0] < 0:
            raise NotExportable("the dense part does not fit the first GPU")
        return build_milp(p, c, secant(v_max(c))).lp()
