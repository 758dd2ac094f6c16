"""Lookup table from a model's observed request rate to its prefill and decode pools
(``kind: serverless``), for the online scheduler's merging decisions.

The compiler solves the serverless problem of a base file for one epoch at each
rate of a grid (one model at a time, the others idle), certifies every plan with
the family's verifier, and writes per (model, rate) cell the instances of every
pool (node, phase, link, option), the objective and the bound into a table file
(``tables.format``: axes ``model`` (category), ``rate`` (ceil: a rate maps to the
first grid rate at or above it), ``pool`` (category)). Online, the observed rate
(with the headroom the scheduler wants) gives the cell; its decode instances are
how many the pool may merge down to. A rate above the grid, or a cell without a
plan, has ``feasible`` 0.

The table also carries what an online merge decision reads of a decode instance,
per (model, option): its SLO capacity, batch at that capacity, KV budget and
holding cost per second (``decode_*``, ``held_per_s``), the two links' latency and
bandwidth, and the batch limit (meta ``max_batch``). ``RateTable.merge_decision``
takes the simulator's merge decision from these alone (no performance model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.families import certify, family
from energyopt.families.serverless.figures import decode_figures
from energyopt.families.serverless.formulations.merge import DecodeFigures, Snapshot
from energyopt.families.serverless.formulations.model import (
    LINKS,
    ServerlessProblem,
    build_problem,
    option_name,
)
from energyopt.families.serverless.merge_policy import MergePolicy
from energyopt.families.serverless.solvers.merge import MergeOutcome
from energyopt.families.serverless.spec import ServerlessPlan
from energyopt.perf.kvtransfer import Link
from energyopt.progress import Progress, quiet
from energyopt.tables.format import ColumnData, Table, TableError, write_table
from energyopt.tables.stdlib_reader import Axis

KIND = "serverless-rates"


def pool_names(p: ServerlessProblem) -> list[str]:
    """Every pool a plan may hold: ``node/phase/link/share%/tpN/clockMHz``."""
    out = []
    for node in p.spec.nodes:
        for opt in p.options:
            for phase, link in (("prefill", "nvlink"), ("prefill", "network"), ("decode", "-")):
                out.append(
                    f"{node.name}/{phase}/{link}/{opt.share_pct}%/tp{opt.tp}/{opt.clock_mhz}MHz"
                )
    return out


def _pool_of(pool: object) -> str:
    from energyopt.families.serverless.spec import Pool

    assert isinstance(pool, Pool)
    link = pool.link or "-"
    return f"{pool.node}/{pool.phase}/{link}/{pool.share_pct}%/tp{pool.tp}/{pool.clock_mhz}MHz"


def rate_problem(base: ServerlessProblem, model: int, rate_rps: float) -> ServerlessProblem:
    """``base`` as one epoch in which ``model`` has ``rate_rps`` and the others none."""
    models = tuple(
        m.model_copy(update={"demand_rps": (rate_rps if i == model else 0.0,)})
        for i, m in enumerate(base.spec.models)
    )
    spec = base.spec.model_copy(update={"models": models})
    return build_problem(
        spec, f"{base.source} ({base.spec.models[model].name} at {rate_rps:g} rps)"
    )


def compile_rate_table(
    base: ServerlessProblem,
    rates_rps: list[float],
    path: str | Path,
    *,
    solver: str = "auto",
    time_limit_s: float = 30.0,
    progress: Progress = quiet,
) -> dict[tuple[str, float], float | None]:
    """Solve every (model, rate) cell and write the table; the objective of each cell
    (None where no plan was found)."""
    fam = family("serverless")
    rates = sorted(set(float(r) for r in rates_rps))
    names = pool_names(base)
    index = {n: i for i, n in enumerate(names)}
    models = [m.name for m in base.spec.models]
    counts = np.zeros((len(models), len(rates), len(names)), dtype=np.int32)
    objective = np.full((len(models), len(rates)), np.nan)
    bound = np.full((len(models), len(rates)), np.nan)
    feasible = np.zeros((len(models), len(rates)), dtype=np.uint8)
    out: dict[tuple[str, float], float | None] = {}
    for m, name in enumerate(models):
        for k, rate in enumerate(rates):
            p = rate_problem(base, m, rate)
            res = fam.solve(p, solver, time_limit_s=time_limit_s, rel_gap=1e-6, progress=quiet)
            certify(fam, p, res, 1e-6, lambda _: None)
            plan: ServerlessPlan | None = res.plan
            out[(name, rate)] = res.objective if plan is not None else None
            if plan is None:
                continue
            for pool in plan.epochs[0].pools:
                counts[m, k, index[_pool_of(pool)]] += pool.count
            objective[m, k] = float(res.objective) if res.objective is not None else np.nan
            bound[m, k] = np.nan if res.bound is None else res.bound
            feasible[m, k] = 1
            progress(f"serverless table: {name} at {rate:g} rps: {res.objective:.6g}")
    axes = [
        Axis("model", "category", tuple(models)),
        Axis("rate", "ceil", tuple(rates)),
        Axis("pool", "category", tuple(names)),
        Axis("option", "category", tuple(option_name(o) for o in base.options)),
        Axis("link", "category", LINKS),
    ]
    unit = base.unit
    figs = [[decode_figures(base, m, o) for o in range(base.n_options)] for m in range(len(models))]

    def per_option(field: str) -> np.ndarray:
        return np.array([[getattr(f, field) for f in row] for row in figs], dtype=np.float64)

    mo = ("model", "option")
    nan = float("nan")
    columns = {
        "count": ColumnData(counts, ("model", "rate", "pool"), "<i4", 0),
        "objective": ColumnData(objective, ("model", "rate"), "<f8", nan, unit),
        "bound": ColumnData(bound, ("model", "rate"), "<f8", nan, unit),
        "feasible": ColumnData(feasible, ("model", "rate"), "<u1", 0),
        "decode_capacity_rps": ColumnData(per_option("capacity_rps"), mo, "<f8", nan, "rps"),
        "decode_batch_at_capacity": ColumnData(per_option("batch_at_capacity"), mo, "<f8", nan),
        "decode_kv_budget_bytes": ColumnData(per_option("kv_budget_bytes"), mo, "<f8", nan, "B"),
        "held_per_s": ColumnData(per_option("held_per_s"), mo, "<f8", nan, f"{unit}/s"),
        "link_latency_s": ColumnData(
            np.array([lk.latency_s for lk in base.links]), ("link",), "<f8", nan, "s"
        ),
        "link_bandwidth_bps": ColumnData(
            np.array([lk.bandwidth_bps for lk in base.links]), ("link",), "<f8", nan, "B/s"
        ),
    }
    meta = {
        "base": base.source,
        "epoch_s": base.epoch_s,
        "solver": solver,
        "max_batch": base.spec.options.max_batch,
    }
    write_table(path, KIND, axes, columns, meta)
    return out


@dataclass
class RateTable:
    """A compiled rate table, open for lookups."""

    table: Table

    @classmethod
    def open(cls, path: str | Path) -> RateTable:
        table = Table.open(path)
        if table.kind != KIND:
            raise TableError(str(path), f"a {table.kind!r} table, not {KIND!r}")
        return cls(table)

    def cell(self, model: str, rate_rps: float) -> tuple[int, int] | None:
        """(model, rate) indices of the cell for ``rate_rps`` (the first grid rate at or
        above it); None for an unknown model or a rate above the grid."""
        m = self.table.axes["model"].index(model)
        k = self.table.axes["rate"].index(rate_rps)
        if m < 0 or k < 0:
            return None
        return m, k

    def pools(self, model: str, rate_rps: float) -> dict[str, int] | None:
        """Instances per pool the cell of ``rate_rps`` holds; None where it has none."""
        found = self.cell(model, rate_rps)
        if found is None or not int(self.table.array("feasible")[found]):
            return None
        names = self.table.axes["pool"].values
        row = self.table.array("count")[found]
        return {str(names[i]): int(c) for i, c in enumerate(row) if c > 0}

    def decode_instances(self, model: str, rate_rps: float) -> int | None:
        """Decode instances of the model the cell of ``rate_rps`` keeps (what a pool may
        merge down to); None where the cell has no plan."""
        pools = self.pools(model, rate_rps)
        if pools is None:
            return None
        return sum(c for name, c in pools.items() if name.split("/")[1] == "decode")

    def option_names(self) -> tuple[str, ...]:
        """The options (``share%/tpN/clockMHz``) in the order decode figures index them."""
        return tuple(str(v) for v in self.table.axes["option"].values)

    def decode_figures(self, model: str) -> dict[int, DecodeFigures]:
        """Decode figures of ``model`` on every option (by option index); TableError
        for a model the table does not hold."""
        m = self.table.axes["model"].index(model)
        if m < 0:
            raise TableError(self.table.path, f"no model {model!r}")
        cols = [
            self.table.array(c)[m]
            for c in (
                "decode_capacity_rps",
                "decode_batch_at_capacity",
                "decode_kv_budget_bytes",
                "held_per_s",
            )
        ]
        return {
            o: DecodeFigures(*(float(c[o]) for c in cols)) for o in range(len(self.option_names()))
        }

    def links(self) -> tuple[Link, Link]:
        """(nvlink, network) links of a migration inside a node and across nodes."""
        lat = self.table.array("link_latency_s")
        bw = self.table.array("link_bandwidth_bps")
        return Link(float(lat[0]), float(bw[0])), Link(float(lat[1]), float(bw[1]))

    @property
    def max_batch(self) -> int:
        return int(self.table.meta["max_batch"])

    def merge_decision(
        self,
        model: str,
        snapshots: tuple[Snapshot, ...],
        *,
        need_rps: float,
        other_capacity_rps: float,
        remaining_s: float,
        policy: MergePolicy,
    ) -> MergeOutcome:
        """The merge decision on ``model``'s decode instances (``snapshots``: option
        indices into ``option_names``), from the table's figures and links alone: what
        the simulator decides when it reads this table."""
        prob = policy.problem(
            snapshots,
            self.decode_figures(model),
            need_rps=need_rps,
            other_capacity_rps=other_capacity_rps,
            remaining_s=remaining_s,
            max_batch=self.max_batch,
            links=self.links(),
        )
        return policy.decide(prob)
