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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.families import certify, family
from energyopt.formulations.serverless.model import ServerlessProblem, build_problem
from energyopt.progress import Progress, quiet
from energyopt.spec.serverless import ServerlessPlan
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
    from energyopt.spec.serverless import Pool

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
    ]
    unit = base.unit
    columns = {
        "count": ColumnData(counts, ("model", "rate", "pool"), "<i4", 0),
        "objective": ColumnData(objective, ("model", "rate"), "<f8", float("nan"), unit),
        "bound": ColumnData(bound, ("model", "rate"), "<f8", float("nan"), unit),
        "feasible": ColumnData(feasible, ("model", "rate"), "<u1", 0),
    }
    meta = {"base": base.source, "epoch_s": base.epoch_s, "solver": solver}
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
