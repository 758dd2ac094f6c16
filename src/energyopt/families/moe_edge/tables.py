"""Lookup table from the observed activation mix to the MoE placement (``kind: moe-edge``).

Two measured routing statistics of one model, A and B (two domains or tasks), span
the mixes ``f(a) = a f_A + (1 - a) f_B``. The compiler solves the moe-edge problem
of the base file (its server, SLO and objective) with the shares of each mix on a
grid of ``a`` and writes, per cell, every expert's place, the dense GPU, the clocks
and the objective into a table file (``tables.format``: axes ``mix`` (ceil),
``item`` and ``gpu``). Online, the shares counted over a window give the mix
estimate ``a = <f_obs - f_B, f_A - f_B> / |f_A - f_B|^2`` (least squares on the
segment, clipped to 0..1), rounded to the nearest cell; the lookup returns that
cell's plan. A cell without a plan has place 255 and ``feasible`` 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.catalog.loader import builtin_catalog
from energyopt.families import certify, family
from energyopt.families.moe_edge.formulations.model import (
    FloatArray,
    MoeEdgeProblem,
    build_problem,
)
from energyopt.families.moe_edge.spec import Activations, LayerActivation, MoeEdgePlan
from energyopt.progress import Progress, quiet
from energyopt.tables.format import ColumnData, Table, TableError, write_table
from energyopt.tables.stdlib_reader import Axis

KIND = "moe-edge-mix"
NO_PLACE = 255


def mixed_problem(
    base: MoeEdgeProblem, freq_a: FloatArray, freq_b: FloatArray, a: float
) -> MoeEdgeProblem:
    """``base`` with the shares ``a f_A + (1 - a) f_B``."""
    freq = a * freq_a + (1.0 - a) * freq_b
    acts = Activations(
        source=f"mix {a:g} of A and {1 - a:g} of B ({base.spec.activations.source})",
        layers=tuple(
            LayerActivation(layer=i, frequencies=tuple(float(x) for x in row))
            for i, row in enumerate(freq)
        ),
    )
    spec = base.spec.model_copy(update={"activations": acts})
    catalog = builtin_catalog().merged(list(base.gpus), [base.model])
    return build_problem(spec, f"{base.source} (mix {a:g})", catalog)


def compile_mix_table(
    base: MoeEdgeProblem,
    freq_a: FloatArray,
    freq_b: FloatArray,
    path: str | Path,
    *,
    cells: int = 11,
    solver: str = "auto",
    time_limit_s: float = 60.0,
    progress: Progress = quiet,
) -> list[float | None]:
    """Solve ``cells`` mixes from all-B (0) to all-A (1) and write the table; the
    objective of each cell (None where no plan was found)."""
    fam = family("moe-edge")
    mixes = [float(x) for x in np.linspace(0.0, 1.0, cells)]
    names = [g.name for g in base.spec.server.gpus]
    place = np.full((cells, base.n_items), NO_PLACE, dtype=np.uint8)
    clocks = np.zeros((cells, base.n_gpus), dtype=np.int32)
    dense = np.full(cells, -1, dtype=np.int32)
    objective = np.full(cells, np.nan)
    bound = np.full(cells, np.nan)
    feasible = np.zeros(cells, dtype=np.uint8)
    out: list[float | None] = []
    for k, a in enumerate(mixes):
        p = mixed_problem(base, freq_a, freq_b, a)
        res = fam.solve(p, solver, time_limit_s=time_limit_s, rel_gap=1e-4, progress=quiet)
        certify(fam, p, res, 1e-4, lambda _: None)
        if res.plan is None:
            out.append(None)
            continue
        config, choice = p.choice_of(res.plan)
        place[k] = choice.astype(np.uint8)
        clocks[k] = config.clocks
        dense[k] = config.dense
        objective[k] = res.objective
        bound[k] = np.nan if res.bound is None else res.bound
        feasible[k] = 1
        out.append(res.objective)
        progress(f"moe-edge table: mix {a:.2f}: {res.objective:.6g} ({res.status})")
    axes = [
        Axis("mix", "ceil", tuple(mixes)),
        Axis("item", "exact", tuple(float(i) for i in range(base.n_items))),
        Axis("gpu", "category", tuple(names)),
    ]
    columns = {
        "place": ColumnData(place, ("mix", "item"), "<u1", NO_PLACE),
        "clock_mhz": ColumnData(clocks, ("mix", "gpu"), "<i4", 0, "MHz"),
        "dense_gpu": ColumnData(dense, ("mix",), "<i4", -1),
        "objective": ColumnData(objective, ("mix",), "<f8", float("nan"), _unit(base)),
        "bound": ColumnData(bound, ("mix",), "<f8", float("nan"), _unit(base)),
        "feasible": ColumnData(feasible, ("mix",), "<u1", 0),
    }
    meta = {
        "model": base.model.name,
        "layers": base.n_layers,
        "experts": base.n_experts,
        "places": [*names, "fetch", "cpu"],
        "freq_a": np.round(freq_a, 9).ravel().tolist(),
        "freq_b": np.round(freq_b, 9).ravel().tolist(),
        "base": base.source,
    }
    write_table(path, KIND, axes, columns, meta)
    return out


def _unit(p: MoeEdgeProblem) -> str:
    return "J/token" if p.spec.objective.kind == "energy" else "ms/token"


@dataclass
class MixTable:
    """A compiled mix table, open for lookups."""

    table: Table

    @classmethod
    def open(cls, path: str | Path) -> MixTable:
        table = Table.open(path)
        if table.kind != KIND:
            raise TableError(str(path), f"a {table.kind!r} table, not {KIND!r}")
        return cls(table)

    @property
    def mixes(self) -> tuple[float, ...]:
        return tuple(float(x) for x in self.table.axes["mix"].values)

    def estimate(self, observed: FloatArray) -> float:
        """The mix ``a`` whose shares are nearest (least squares) to ``observed``
        ((L, E) shares, or counts: they are scaled to the reference's total)."""
        fa = np.asarray(self.table.meta["freq_a"], dtype=np.float64)
        fb = np.asarray(self.table.meta["freq_b"], dtype=np.float64)
        obs = np.asarray(observed, dtype=np.float64).ravel()
        total = obs.sum()
        if total > 0:
            obs = obs * (fa.sum() / total)
        d = fa - fb
        norm = float(d @ d)
        if norm <= 0:
            return 1.0
        return float(np.clip((obs - fb) @ d / norm, 0.0, 1.0))

    def cell(self, a: float) -> int:
        """Index of the grid mix nearest ``a``."""
        return int(np.argmin(np.abs(np.asarray(self.mixes) - a)))

    def plan(self, observed: FloatArray) -> tuple[float, MoeEdgePlan | None]:
        """(the mix estimate, the plan of its nearest cell, None if that cell has none)."""
        a = self.estimate(observed)
        k = self.cell(a)
        return a, self.plan_at(k)

    def plan_at(self, k: int) -> MoeEdgePlan | None:
        t = self.table
        if not int(t.array("feasible")[k]):
            return None
        meta = t.meta
        places = list(meta["places"])
        gpus = list(t.axes["gpu"].values)
        grid = np.asarray(t.array("place")[k], dtype=np.int64).reshape(
            int(meta["layers"]), int(meta["experts"])
        )
        return MoeEdgePlan(
            dense_gpu=str(gpus[int(t.array("dense_gpu")[k])]),
            clocks_mhz={str(g): int(c) for g, c in zip(gpus, t.array("clock_mhz")[k], strict=True)},
            placement=tuple(tuple(places[int(o)] for o in row) for row in grid),
        )
