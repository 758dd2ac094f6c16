"""Reader of energyopt lookup tables (``.eot`` files) using only the standard library.

This module imports nothing from energyopt or numpy, so it can be copied into a
scheduler as is. The format is described byte by byte in docs/tables.md:

* 24-byte prefix: magic ``b"EOTABLE\\0"``, u32 format version, u32 flags (0),
  u64 header length H (all little-endian)
* H bytes of UTF-8 JSON header (axes, columns, metadata)
* zero padding up to the next multiple of 64 bytes: the data section starts there
* columns: fixed-width little-endian arrays, C order, each at a 64-byte aligned
  offset relative to the data section start
* 32 bytes: SHA-256 of every byte before them

Lookup semantics: a ``category`` axis matches a string exactly, an ``exact`` axis
matches a number exactly, and a ``ceil`` axis rounds the key UP to the next grid
value (conservative). A key outside an axis (unknown name, or above the top grid
value) never raises: the column's ``fallback`` value is returned and
``in_grid`` is False.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import struct
import sys
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"EOTABLE\x00"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sIIQ")
"""magic, format version, flags, header length (bytes)."""
ALIGN = 64
DIGEST_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_HEADER_DEPTH = 64
"""Most levels of arrays and objects the header nests (the header object is 1)."""

DTYPES: dict[str, tuple[str, int]] = {
    "<f8": ("d", 8),
    "<f4": ("f", 4),
    "<i8": ("q", 8),
    "<i4": ("i", 4),
    "<u1": ("B", 1),
}
"""Column dtype (numpy spelling) -> (struct/memoryview format code, bytes per item)."""
AXIS_KINDS = ("category", "exact", "ceil")


class TableFormatError(ValueError):
    """A table file that cannot be used: truncated, corrupted, wrong magic or version."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Axis:
    """One key of the table: its name, matching rule and grid values."""

    name: str
    kind: str  # category | exact | ceil
    values: tuple[Any, ...]

    def index(self, key: Any) -> int:
        """Position of ``key`` on this axis, or -1 when it is outside the grid."""
        if self.kind == "category":
            try:
                return self.values.index(str(key))
            except ValueError:
                return -1
        try:
            x = float(key)
        except (TypeError, ValueError):
            return -1
        if math.isnan(x):
            return -1
        if self.kind == "exact":
            try:
                return self.values.index(x)
            except ValueError:
                return -1
        i = bisect_left(self.values, x)
        return i if i < len(self.values) else -1


@dataclass(frozen=True)
class Column:
    """One data array: dtype, the axes it is indexed by (C order) and where it lies."""

    name: str
    dtype: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    offset: int  # bytes from the data section start
    nbytes: int
    fallback: float | int


@dataclass(frozen=True)
class Layout:
    """Everything the header says, checked against the file size."""

    version: int
    header: dict[str, Any]
    axes: dict[str, Axis]
    columns: dict[str, Column]
    data_start: int
    data_bytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number the format allows")


def json_depth(value: Any) -> int:
    """Levels of arrays and objects in parsed JSON ``value`` (0 for a scalar),
    counted without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _parse_axis(entry: Any, path: str, i: int) -> Axis:
    """One header axis, checked: name, kind and a non-empty grid of the right type."""
    if not isinstance(entry, dict):
        raise TableFormatError(path, f"corrupted header: axes[{i}] is not an object")
    name, kind, values = entry.get("name"), entry.get("kind"), entry.get("values")
    where = f"corrupted header: axes[{i}]"
    if not isinstance(name, str) or not name:
        raise TableFormatError(path, f"{where}.name: must be a non-empty string")
    if kind not in AXIS_KINDS:
        raise TableFormatError(path, f"axis {name!r}: unknown kind {kind!r}")
    if not isinstance(values, list) or not values:
        raise TableFormatError(path, f"axis {name!r}: values must be a non-empty list")
    if kind == "category":
        if not all(isinstance(v, str) for v in values):
            raise TableFormatError(path, f"axis {name!r}: category values must be strings")
    elif not all(_is_number(v) for v in values):
        raise TableFormatError(path, f"axis {name!r}: {kind} values must be finite numbers")
    if len(set(values)) != len(values):
        raise TableFormatError(path, f"axis {name!r}: a value is given twice")
    if kind == "ceil" and values != sorted(values):
        raise TableFormatError(path, f"axis {name!r}: ceil values must be ascending")
    return Axis(name, kind, tuple(values))


def _parse_column(entry: Any, path: str, i: int, axes: dict[str, Axis]) -> Column:
    """One header column, checked against the axes: names, dtype, offset, fallback."""
    if not isinstance(entry, dict):
        raise TableFormatError(path, f"corrupted header: columns[{i}] is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name or name == "in_grid":
        raise TableFormatError(
            path, f"corrupted header: columns[{i}].name: must be a non-empty string (not in_grid)"
        )
    names = entry.get("axes")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TableFormatError(path, f"column {name!r}: axes must be a list of axis names")
    for n in names:
        if n not in axes:
            raise TableFormatError(path, f"column {name!r}: unknown axis {n!r}")
    if len(set(names)) != len(names):
        raise TableFormatError(path, f"column {name!r}: an axis is named twice")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TableFormatError(path, f"column {name!r}: unknown dtype {dtype!r}")
    sizes: list[int] = []
    for field in ("offset", "nbytes"):
        value = entry.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TableFormatError(path, f"column {name!r}: {field} must be a whole number >= 0")
        sizes.append(value)
    offset, nbytes = sizes
    fallback = entry.get("fallback")
    if fallback is not None and not _is_number(fallback):
        raise TableFormatError(path, f"column {name!r}: fallback must be a number or null")
    shape = tuple(len(axes[n].values) for n in names)
    return Column(
        name,
        dtype,
        tuple(names),
        shape,
        offset,
        nbytes,
        math.nan if fallback is None else fallback,
    )


def _parse_header(
    header: dict[str, Any], path: str, data_bytes: int
) -> tuple[dict[str, Axis], dict[str, Column]]:
    """The axes and columns a header describes; TableFormatError for anything that
    a lookup could not use (the checksum only proves the bytes are as written)."""
    raw_axes, raw_columns = header.get("axes"), header.get("columns")
    if not isinstance(raw_axes, list) or not isinstance(raw_columns, list):
        raise TableFormatError(path, "corrupted header: axes and columns must be lists")
    axes: dict[str, Axis] = {}
    for i, entry in enumerate(raw_axes):
        axis = _parse_axis(entry, path, i)
        if axis.name in axes:
            raise TableFormatError(path, f"axis {axis.name!r} is given twice")
        axes[axis.name] = axis
    columns: dict[str, Column] = {}
    for i, entry in enumerate(raw_columns):
        col = _parse_column(entry, path, i, axes)
        if col.name in columns or col.name in axes:
            raise TableFormatError(path, f"column {col.name!r}: the name is given twice")
        count = math.prod(col.shape)
        if col.nbytes != count * DTYPES[col.dtype][1] or col.offset % ALIGN:
            raise TableFormatError(path, f"column {col.name!r}: size or offset is inconsistent")
        if col.offset + col.nbytes > data_bytes:
            raise TableFormatError(path, f"column {col.name!r}: runs past the data section")
        columns[col.name] = col
    if not isinstance(header.get("kind", ""), str) or not isinstance(header.get("meta", {}), dict):
        raise TableFormatError(path, "corrupted header: kind must be a string, meta an object")
    return axes, columns


def parse_layout(buf: Any, path: str, verify: bool = True) -> Layout:
    """Check magic, version, sizes and (if ``verify``) the SHA-256; parse the header.

    ``buf`` is any bytes-like object holding the whole file (bytes or an mmap).
    Raises TableFormatError naming ``path``.
    """
    size = len(buf)
    if size < PREFIX.size:
        raise TableFormatError(path, f"truncated: {size} bytes, shorter than the prefix")
    magic, version, flags, header_len = PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise TableFormatError(path, f"not an energyopt table (magic {bytes(magic)!r})")
    if version != FORMAT_VERSION:
        raise TableFormatError(
            path, f"format version {version}; this reader reads version {FORMAT_VERSION}"
        )
    if flags != 0:
        raise TableFormatError(path, f"unknown flags {flags:#x}")
    if header_len > MAX_HEADER_BYTES or PREFIX.size + header_len > size:
        raise TableFormatError(path, f"truncated: header of {header_len} bytes does not fit")
    too_deep = f"corrupted header: nested more than {MAX_HEADER_DEPTH} levels deep"
    try:
        header = json.loads(
            bytes(buf[PREFIX.size : PREFIX.size + header_len]).decode("utf-8"),
            object_pairs_hook=_json_object,
            parse_constant=_no_constant,
        )
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise TableFormatError(path, f"corrupted header: {exc}") from None
    except RecursionError:  # nested beyond what the parser follows: far too deep
        raise TableFormatError(path, too_deep) from None
    if json_depth(header) > MAX_HEADER_DEPTH:
        raise TableFormatError(path, too_deep)
    if not isinstance(header, dict):
        raise TableFormatError(path, "corrupted header: not a JSON object")
    data_start = _align(PREFIX.size + header_len)
    data_bytes = header.get("data_bytes")
    if not isinstance(data_bytes, int) or data_bytes < 0:
        raise TableFormatError(path, "corrupted header: data_bytes missing")
    expected = data_start + data_bytes + DIGEST_BYTES
    if size != expected:
        what = "truncated" if size < expected else "trailing bytes"
        raise TableFormatError(path, f"{what}: {size} bytes, the header says {expected}")
    if verify:
        digest = hashlib.sha256(memoryview(buf)[: size - DIGEST_BYTES]).digest()
        if digest != bytes(buf[size - DIGEST_BYTES :]):
            raise TableFormatError(path, "checksum mismatch: the file is corrupted")
    axes, columns = _parse_header(header, path, data_bytes)
    return Layout(version, header, axes, columns, data_start, data_bytes)


class StdlibTable:
    """A table file, memory-mapped, read with ``memoryview`` (no numpy)."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as fh:
                if fh.seek(0, 2) == 0:
                    raise TableFormatError(self.path, "truncated: empty file")
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise TableFormatError(self.path, f"cannot read: {exc.strerror or exc}") from None
        try:
            self.layout = parse_layout(self._mm, self.path, verify)
        except TableFormatError:
            self._mm.close()
            raise
        self.axes = self.layout.axes
        self.columns = self.layout.columns
        self._views: dict[str, memoryview] = {}
        base = memoryview(self._mm)
        for col in self.columns.values():
            start = self.layout.data_start + col.offset
            raw = base[start : start + col.nbytes]
            code = DTYPES[col.dtype][0]
            # memoryview reads in native byte order; the file is little-endian
            if sys.byteorder == "little":
                raw = raw.cast(code)  # type: ignore[call-overload]
            self._views[col.name] = raw
        self._base = base

    @property
    def header(self) -> dict[str, Any]:
        """The parsed JSON header."""
        return self.layout.header

    def value(self, column: str, flat: int) -> float | int:
        """Item ``flat`` (C-order position) of ``column``."""
        view = self._views[column]
        if sys.byteorder == "little":
            return view[flat]  # type: ignore[no-any-return,unused-ignore]
        col = self.columns[column]
        code, width = DTYPES[col.dtype]
        return struct.unpack_from("<" + code, view, flat * width)[0]  # type: ignore[no-any-return]

    def lookup(self, **key: Any) -> dict[str, Any]:
        """Values of every column whose axes are all in ``key``, plus ``in_grid``.

        Unknown key names raise KeyError; out-of-grid key values never raise
        (the column fallbacks are returned with ``in_grid`` False).
        """
        unknown = set(key) - set(self.axes)
        if unknown:
            raise KeyError(f"unknown key(s) {sorted(unknown)}; axes are {list(self.axes)}")
        index = {name: self.axes[name].index(v) for name, v in key.items()}
        out: dict[str, Any] = {}
        in_grid = True
        for col in self.columns.values():
            if not all(a in index for a in col.axes):
                continue
            flat = 0
            ok = True
            for a, n in zip(col.axes, col.shape, strict=True):
                i = index[a]
                if i < 0:
                    ok = False
                    break
                flat = flat * n + i
            if ok:
                out[col.name] = self.value(col.name, flat)
            else:
                in_grid = False
                out[col.name] = col.fallback
        out["in_grid"] = in_grid
        return out

    def close(self) -> None:
        """Release the views and the map."""
        for view in self._views.values():
            view.release()
        self._views.clear()
        self._base.release()
        self._mm.close()

    def __enter__(self) -> StdlibTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
