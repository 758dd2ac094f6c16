"""Lookup compiler: solved instances into constant-time tables for online schedulers.

See docs/tables.md for the file format and the lookup semantics. Reading a table
needs only ``format``; the compile spec's names are imported on first use. The
compiler of serving tables is the serving family's
(``energyopt.families.serving.tables.compile_table``); the other families compile
theirs through the registry.
"""

from __future__ import annotations

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
    "load_checked",
    "load_compile_spec",
    "write_table",
]




def __getattr__(name: str) -> Any:
    """The compile spec's names (``energyopt.tables.spec``), imported on first use."""
    if name in ("CompileSpec", "SloTier", "load_checked", "load_compile_spec"):
        from energyopt.tables import spec

        value = getattr(spec, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
