"""Lookup compiler: solved instances into constant-time tables for online schedulers.

See docs/tables.md for the file format and the lookup semantics. Reading a table
needs only ``format``; the compiler's modules (solvers, the performance model) are
imported when a table is compiled or their names are first used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from energyopt.tables.format import Axis, ColumnData, Table, TableError, write_table

if TYPE_CHECKING:
    from energyopt.tables.spec import CompileSpec, SloTier, load_checked, load_compile_spec

__all__ = [
    "Axis",
    "ColumnData",
    "CompileSpec",
    "SloTier",
    "Table",
    "TableError",
    "compile_table",
    "load_checked",
    "load_compile_spec",
    "write_table",
]


def compile_table(
    spec_path: str | Path,
    output: str | Path,
    workers: int = 1,
    say: Callable[[str], None] | None = None,
    scheduler: Any = None,
) -> str:
    """Compile the table a spec file describes into ``output``; returns its kind.

    Plan cells run on ``workers`` local processes, or on the Dask distributed
    cluster at ``scheduler`` (an address such as ``tcp://host:8786``) when given.
    """
    from energyopt.tables.oppoints import build_oppoint_columns
    from energyopt.tables.plans import build_plan_columns, solve_cells
    from energyopt.tables.spec import load_checked

    spec, base, problem = load_checked(spec_path)
    if spec.kind == "oppoints":
        axes, columns, meta = build_oppoint_columns(
            problem, spec.load_points, spec.load_max_rps, spec.slo_tiers, spec.gpu_types
        )
    else:
        cells, records = solve_cells(spec, base, problem, output, workers, say, scheduler)
        axes, columns, meta = build_plan_columns(spec, problem, cells, records)
    write_table(output, spec.kind, axes, columns, meta)
    return spec.kind


def __getattr__(name: str) -> Any:
    """The compile spec's names (``energyopt.tables.spec``), imported on first use."""
    if name in ("CompileSpec", "SloTier", "load_checked", "load_compile_spec"):
        from energyopt.tables import spec

        value = getattr(spec, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
