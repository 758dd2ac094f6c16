"""Writer of the table file format (docs/tables.md) and the numpy ``Table`` reader."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from energyopt.spec.errors import SpecError
from energyopt.tables.rowlookup import (
    IN_GRID,
    Source,
    column_by_column,
    compile_lookup,
    finder,
    indexer,
)
from energyopt.tables.stdlib_reader import (
    ALIGN,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_DEPTH,
    PREFIX,
    Axis,
    Column,
    Layout,
    TableFormatError,
    json_depth,
    parse_layout,
)

__all__ = ["Axis", "ColumnData", "Table", "TableError", "write_table"]


class TableError(SpecError):
    """A table file that cannot be used (or a bad lookup key); names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__([f"{path}: {reason}"])
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class ColumnData:
    """A column to write: its array (shape = sizes of ``axes``), axes and fallback."""

    values: NDArray[Any]
    axes: tuple[str, ...]
    dtype: str  # one of stdlib_reader.DTYPES
    fallback: float | int
    unit: str = ""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_table(
    path: str | Path,
    kind: str,
    axes: Sequence[Axis],
    columns: Mapping[str, ColumnData],
    meta: Mapping[str, Any] | None = None,
) -> None:
    """Write a table file atomically (temporary file, then rename)."""
    from energyopt.spec.io import write_bytes_atomic  # file I/O a reader does not need

    by_name = {a.name: a for a in axes}
    col_headers: list[dict[str, Any]] = []
    blobs: list[tuple[int, bytes]] = []
    offset = 0
    for name, col in columns.items():
        shape = tuple(len(by_name[a].values) for a in col.axes)
        arr = np.asarray(col.values).astype(np.dtype(col.dtype), order="C")  # 0-d stays 0-d
        if arr.shape != shape:
            raise ValueError(f"column {name}: shape {arr.shape}, axes give {shape}")
        data = arr.tobytes(order="C")
        fallback: float | int | None = col.fallback
        if isinstance(fallback, float) and math.isnan(fallback):
            fallback = None
        col_headers.append(
            {
                "name": name,
                "dtype": col.dtype,
                "axes": list(col.axes),
                "offset": offset,
                "nbytes": len(data),
                "fallback": fallback,
                "unit": col.unit,
            }
        )
        blobs.append((offset, data))
        offset = _align(offset + len(data))
    data_bytes = blobs[-1][0] + len(blobs[-1][1]) if blobs else 0
    header = {
        "kind": kind,
        "axes": [{"name": a.name, "kind": a.kind, "values": list(a.values)} for a in axes],
        "columns": col_headers,
        "data_bytes": data_bytes,
        "meta": dict(meta or {}),
    }
    if json_depth(header) > MAX_HEADER_DEPTH:
        raise ValueError(f"meta nests deeper than a reader accepts ({MAX_HEADER_DEPTH} levels)")
    head = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    prefix = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(head)) + head
    body = bytearray(_align(len(prefix)) + data_bytes)
    body[: len(prefix)] = prefix
    start = _align(len(prefix))
    for off, data in blobs:
        body[start + off : start + off + len(data)] = data
    digest = hashlib.sha256(body).digest()
    try:
        write_bytes_atomic(path, bytes(body) + digest)
    except SpecError as exc:
        reason = exc.problems[0].removeprefix(f"{path}: ")
        raise TableError(str(path), reason) from None


LOOKUP_CACHE_ENTRIES = 64
"""Most compiled ``Table.lookup`` functions one table keeps (one per set of key
names; the least recently used is dropped first). Each keeps 10-25 KiB
(docs/tables.md), so a full cache holds under about 1.5 MiB."""


def _items(arr: NDArray[Any]) -> memoryview:
    """The flat column as a ``memoryview`` whose items are plain Python numbers:
    a view of the mapped file on a little-endian machine, a native copy otherwise."""
    flat = arr.reshape(-1)
    if not flat.dtype.isnative:
        flat = flat.astype(flat.dtype.newbyteorder("="))
    return flat.data


class Table:
    """A table file, memory-mapped; numpy views of its columns.

    Scalar lookups read the mapped file through compiled functions
    (``energyopt.tables.rowlookup``) that hold no reference to the table, so a
    table is freed as soon as its last reference goes."""

    def __init__(self, path: str, layout: Layout, buffer: Any) -> None:
        self.path = path
        self.layout = layout
        self.kind: str = layout.header.get("kind", "")
        self.meta: dict[str, Any] = layout.header.get("meta", {})
        self.axes: dict[str, Axis] = layout.axes
        self.columns: dict[str, Column] = layout.columns
        self._arrays: dict[str, NDArray[Any]] = {}
        for col in self.columns.values():
            arr = np.frombuffer(
                buffer,
                dtype=np.dtype(col.dtype),
                count=math.prod(col.shape),
                offset=layout.data_start + col.offset,
            )
            self._arrays[col.name] = arr.reshape(col.shape)
        self._grids: dict[str, NDArray[Any]] = {
            name: np.asarray(a.values, dtype=object if a.kind == "category" else np.float64)
            for name, a in self.axes.items()
        }
        self._flat = {name: arr.reshape(-1) for name, arr in self._arrays.items()}
        self._sources = {
            col.name: Source(col.name, col.axes, _items(self._arrays[col.name]), col.fallback)
            for col in self.columns.values()
        }
        self._finders = {name: finder(a) for name, a in self.axes.items()}
        self._indexers = {name: indexer(a) for name, a in self.axes.items()}
        self._lookups: OrderedDict[frozenset[str], Callable[[Any], dict[str, Any]]] = (
            OrderedDict()
        )
        self._strides = {
            col.name: tuple(math.prod(col.shape[k + 1 :]) for k in range(len(col.shape)))
            for col in self.columns.values()
        }

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> Table:
        """Map ``path`` read-only; TableError if it is truncated, corrupted or of
        another format version (``verify`` checks the SHA-256 of the whole file)."""
        name = str(path)
        try:
            buffer = np.memmap(name, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            if isinstance(exc, ValueError):
                reason = "truncated: empty file"
            else:  # as every other file: "cannot read: No such file or directory"
                reason = f"cannot read: {exc.strerror or exc}"
            raise TableError(name, reason) from None
        try:
            layout = parse_layout(buffer, name, verify)
        except TableFormatError as exc:
            raise TableError(name, exc.reason) from None
        return cls(name, layout, buffer)

    def array(self, column: str) -> NDArray[Any]:
        """Read-only view of a column, shaped by its axes."""
        return self._arrays[column]

    def _check_keys(self, names: Any) -> None:
        unknown = set(names) - set(self.axes)
        if unknown:
            raise TableError(
                self.path, f"unknown key(s) {sorted(unknown)}; axes are {', '.join(self.axes)}"
            )

    def lookup(self, **key: Any) -> dict[str, Any]:
        """Values of every column whose axes are all in ``key``, plus ``in_grid``.

        Out-of-grid values never raise: the column's fallback is returned and
        ``in_grid`` is False. Unknown key names raise TableError. The first lookup
        with a set of key names (in any order) compiles a lookup function for that
        set (tens of microseconds, 10-25 KiB; the table keeps at most
        ``LOOKUP_CACHE_ENTRIES`` of them, least recently used dropped first);
        later ones cost a few subscripts (``row_getter`` is the fastest path).
        Returns a new dict each call.
        """
        names = frozenset(key)
        cache = self._lookups
        fn = cache.get(names)
        if fn is None:
            fn = self._compile_lookup(names)
        else:
            try:  # noqa: SIM105 (a try costs nothing, suppress() is a call per lookup)
                cache.move_to_end(names)
            except KeyError:  # dropped by another thread in between
                pass
        return fn(key)

    def _compile_lookup(self, names: frozenset[str]) -> Callable[[Any], dict[str, Any]]:
        self._check_keys(names)
        axes = [a for a in self.axes.values() if a.name in names]  # the canonical order
        sources = [self._sources[c] for c in self._columns_within(names)]
        fn: Callable[[Any], dict[str, Any]] = compile_lookup(
            axes, sources, "dict", self._finders, self._indexers
        )
        cache = self._lookups
        cache[names] = fn
        while len(cache) > LOOKUP_CACHE_ENTRIES:
            try:
                cache.popitem(last=False)
            except KeyError:  # emptied by another thread in between
                break
        return fn

    def lookup_once(self, **key: Any) -> dict[str, Any]:
        """``lookup`` without compiling or caching anything: the column-by-column
        path, for a process that looks up one key (``energyopt lookup``)."""
        self._check_keys(key)
        axes = [self.axes[n] for n in key]
        names = self._columns_within(key)
        values = column_by_column(axes, [self._sources[c] for c in names], self._indexers)
        out, in_grid = values(*key.values())
        result = dict(zip(names, out, strict=True))
        result[IN_GRID] = in_grid
        return result

    def row_getter(
        self, *axes: str, columns: Sequence[str] | None = None
    ) -> tuple[tuple[str, ...], Callable[..., tuple[Any, ...]]]:
        """The fastest scalar lookup of several columns: ``(names, f)`` where
        ``f(*keys)`` (keys in the order of ``axes``) returns a tuple of the values of
        ``names`` (default: every column keyed within ``axes``) followed by
        ``in_grid``. Outside the grid it returns the fallbacks (the columns whose keys
        are in the grid keep their values) and False, never raising. ``f`` keeps
        about 10 KiB and no reference to the table."""
        self._check_keys(axes)
        if len(set(axes)) != len(axes):
            raise TableError(self.path, f"repeated key in {axes}")
        names = tuple(columns) if columns is not None else self._columns_within(axes)
        for name in names:
            if name not in self.columns or not set(self.columns[name].axes) <= set(axes):
                raise TableError(self.path, f"column {name} is not keyed within {axes}")
        sources = [self._sources[n] for n in names]
        fn: Callable[..., tuple[Any, ...]] = compile_lookup(
            [self.axes[a] for a in axes], sources, "tuple", self._finders, self._indexers
        )
        return names, fn

    def _columns_within(self, names: Any) -> tuple[str, ...]:
        keys = set(names)
        return tuple(c.name for c in self.columns.values() if set(c.axes) <= keys)

    def getter(self, column: str, *axes: str) -> Callable[..., Any]:
        """A fast scalar lookup of one column: ``f(*keys)`` with keys in the order
        of ``axes`` (default: the column's own axes); returns the fallback outside
        the grid. ``f`` keeps about 10 KiB and no reference to the table."""
        col = self.columns[column]
        order = axes or col.axes
        if sorted(order) != sorted(col.axes):
            raise TableError(self.path, f"column {column} is keyed by {', '.join(col.axes)}")
        on = [self.axes[a] for a in order]
        source = [self._sources[column]]
        return compile_lookup(on, source, "value", self._finders, self._indexers)

    def axis_index(self, name: str, keys: ArrayLike) -> NDArray[np.int64]:
        """Vectorized axis positions of ``keys`` (-1 outside the grid).

        For a category axis, ``keys`` may be strings or integer codes (positions
        on the axis, as ``axes[name].values.index`` gives).
        """
        axis = self.axes[name]
        arr = np.asarray(keys)
        n = len(axis.values)
        if axis.kind == "category":
            if arr.dtype.kind in "iu":
                codes = arr.astype(np.int64)
                return np.where((codes >= 0) & (codes < n), codes, -1)
            table = {v: i for i, v in enumerate(axis.values)}
            return np.fromiter(
                (table.get(str(v), -1) for v in arr.reshape(-1)), np.int64, arr.size
            ).reshape(arr.shape)
        grid = self._grids[name]
        x = arr.astype(np.float64, copy=False)
        i = np.searchsorted(grid, x, side="left")
        if axis.kind == "exact":
            ic = np.minimum(i, n - 1)
            ok = (i < n) & (grid[ic] == x)
        else:
            ok = (i < n) & ~np.isnan(x)
        return np.where(ok, i, -1).astype(np.int64, copy=False)

    def lookup_many(self, keys: Mapping[str, ArrayLike]) -> dict[str, NDArray[Any]]:
        """Vectorized ``lookup``: arrays of keys (broadcast together) -> arrays of
        values for every column whose axes are all in ``keys``, plus ``in_grid``."""
        self._check_keys(keys)
        index = {name: self.axis_index(name, v) for name, v in keys.items()}
        shape = np.broadcast_shapes(*(i.shape for i in index.values())) if index else ()
        out: dict[str, NDArray[Any]] = {}
        in_grid = np.ones(shape, dtype=bool)
        # columns keyed by the same axes share one position and one in-grid mask
        positions: dict[tuple[str, ...], tuple[NDArray[np.int64], NDArray[np.bool_]]] = {}
        for col in self.columns.values():
            if not all(a in index for a in col.axes):
                continue
            if col.axes not in positions:
                flat = np.zeros(shape, dtype=np.int64)
                ok = np.ones(shape, dtype=bool)
                for a, s in zip(col.axes, self._strides[col.name], strict=True):
                    i = index[a]
                    ok &= i >= 0
                    flat += i * s
                flat[~ok] = 0
                positions[col.axes] = (flat, ok)
                in_grid &= ok
            flat, ok = positions[col.axes]
            values = self._flat[col.name][flat]
            if not ok.all():
                fb = np.asarray(col.fallback).astype(values.dtype) if values.size else values
                values = np.where(ok, values, fb)
            out[col.name] = values
        out["in_grid"] = in_grid
        return out

    def describe(self) -> list[str]:
        """Lines for ``energyopt inspect``: format, axes, columns, sizes."""
        lines = [
            f"{self.path}: energyopt table, format version {self.layout.version}, kind {self.kind}",
            f"checksum sha256 {_stored_digest(self.path)} ok",
            f"data {self.layout.data_bytes} bytes at offset {self.layout.data_start}",
            "axes:",
        ]
        for a in self.axes.values():
            vals = list(a.values)
            shown = ", ".join(str(v) for v in vals[:6]) + (", ..." if len(vals) > 6 else "")
            lines.append(f"  {a.name:<20} {a.kind:<8} {len(vals):>5} values: {shown}")
        lines.append("columns:")
        for c in self.columns.values():
            unit = self.layout.header["columns"]
            u = next((h.get("unit", "") for h in unit if h["name"] == c.name), "")
            lines.append(
                f"  {c.name:<20} {c.dtype:<4} [{', '.join(c.axes)}] "
                f"{'x'.join(map(str, c.shape)) or 'scalar'} {c.nbytes} bytes"
                f"{f' ({u})' if u else ''}, fallback {c.fallback}"
            )
        for k, v in self.meta.items():
            text = json.dumps(v)
            lines.append(f"meta {k}: {text if len(text) < 200 else text[:200] + '...'}")
        return lines


def _stored_digest(path: str) -> str:
    with open(path, "rb") as fh:
        fh.seek(-32, os.SEEK_END)
        return fh.read(32).hex()
