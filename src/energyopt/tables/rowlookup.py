"""Compiled scalar lookups: flat index arithmetic over a table's own column memory.

A compiled lookup is one small generated function for one tuple of key names
(``compile_lookup``). It maps every key to its axis position with one C-level call
(a dict subscript for ``category`` and ``exact`` axes, ``bisect_left`` for ``ceil``
axes; a position equal to the axis length means outside the grid), computes the
C-order flat position of each group of columns that share their axes, and reads
each column's item from a ``memoryview`` of the memory-mapped file, which yields a
plain Python number. Nothing is materialized per grid cell: a compiled lookup
holds its namespace (one finder per axis, one view per column) and its code,
10-25 KiB whatever the size of the grid; compiling one takes tens of
microseconds, plus about a millisecond to compile the generated code the first
time a shape is seen (code objects are shared by source text).

Anything unusual (a key outside the grid, NaN, a key of a type its axis cannot
compare) goes to the column-by-column path (``column_by_column``), which never
raises and returns the per-column fallbacks.

A compiled lookup holds no reference to the ``Table`` it reads, so a table that
served lookups is freed as soon as its last reference goes (no reference cycle
waits for the garbage collector).
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, Literal

from energyopt.tables.stdlib_reader import Axis

Finder = Callable[[Any], int]
Indexer = Callable[[Any], int]
Form = Literal["dict", "tuple", "value"]

IN_GRID = "in_grid"


class _Positions(dict[Any, int]):
    """Grid value -> position; a missing key is tried as a string (category axes) or
    a float (exact axes), then maps to ``len(values)``: outside the grid."""

    def __init__(self, values: Sequence[Any], numeric: bool) -> None:
        super().__init__((v, i) for i, v in enumerate(values))
        if numeric:
            self.update({float(v): i for i, v in enumerate(values)})
        self.size = len(values)
        self.numeric = numeric

    def __missing__(self, key: Any) -> int:
        try:
            alt = float(key) if self.numeric else str(key)
            if alt != key and alt == alt:  # alt == alt: not NaN
                return self.get(alt, self.size)
        except (TypeError, ValueError):
            pass
        return self.size


def finder(axis: Axis) -> Finder:
    """A C-level callable: key -> position on ``axis``, ``len(axis.values)`` outside.

    A ``ceil`` axis maps NaN to position 0: callers test ``key == key`` themselves."""
    if axis.kind == "ceil":
        return functools.partial(bisect_left, [float(v) for v in axis.values])
    return _Positions(axis.values, numeric=axis.kind == "exact").__getitem__


def indexer(axis: Axis) -> Indexer:
    """Key -> position on ``axis``, -1 outside the grid; never raises (the same
    answers as ``Axis.index``, faster)."""
    if axis.kind == "category":
        table = {v: i for i, v in enumerate(axis.values)}
        # str() as the standard-library reader does; never raises (unhashable keys too)
        return lambda key: table.get(key if isinstance(key, str) else str(key), -1)
    if axis.kind == "exact":
        exact = {float(v): i for i, v in enumerate(axis.values)}

        def find(key: Any) -> int:
            try:
                return exact.get(float(key), -1)
            except (TypeError, ValueError):
                return -1

        return find
    grid = [float(v) for v in axis.values]
    top = len(grid)

    def ceil(key: Any) -> int:
        try:
            i = bisect_left(grid, key)
        except TypeError:
            return -1
        return i if i < top and key == key else -1  # key != key: NaN

    return ceil


CODE_CACHE_ENTRIES = 256
"""Most generated code objects kept process-wide (a few kilobytes each)."""


@functools.lru_cache(maxsize=CODE_CACHE_ENTRIES)
def _code(source: str) -> CodeType:
    """The code object of a generated lookup; its source holds only generated
    names and sizes, so tables of one shape (a reopened table, another order of
    the same keys) share it and compile nothing."""
    return compile(source, "<energyopt table lookup>", "exec")


@dataclass(frozen=True)
class Source:
    """One column as a compiled lookup reads it.

    ``items`` is the column in C order, flat; subscripting it returns a plain
    Python number (a ``memoryview`` of the file in native byte order)."""

    name: str
    axes: tuple[str, ...]
    items: Sequence[Any]
    fallback: float | int


def column_by_column(
    axes: Sequence[Axis],
    sources: Sequence[Source],
    indexers: Mapping[str, Indexer] | None = None,
) -> Callable[..., tuple[list[Any], bool]]:
    """``f(*keys)`` (keys in the order of ``axes``) -> (the value of every source,
    in_grid): a source with a key outside its axis gives its fallback and makes
    in_grid False. Never raises; nothing is precompiled. ``indexers`` (by axis
    name) shares the ones a table made already."""
    index = [indexers[a.name] if indexers else indexer(a) for a in axes]
    where = {a.name: n for n, a in enumerate(axes)}
    plan: list[tuple[Source, list[tuple[int, int]]]] = []
    sizes = {a.name: len(a.values) for a in axes}
    for src in sources:
        strides = [1] * len(src.axes)
        for k in range(len(src.axes) - 2, -1, -1):
            strides[k] = strides[k + 1] * sizes[src.axes[k + 1]]
        plan.append((src, [(where[a], s) for a, s in zip(src.axes, strides, strict=True)]))

    def values(*keys: Any) -> tuple[list[Any], bool]:
        positions = [f(k) for f, k in zip(index, keys, strict=True)]
        out: list[Any] = []
        in_grid = True
        for src, terms in plan:
            flat = 0
            for n, stride in terms:
                i = positions[n]
                if i < 0:
                    in_grid = False
                    out.append(src.fallback)
                    break
                flat += i * stride
            else:
                out.append(src.items[flat])
        return out, in_grid

    return values


def compile_lookup(
    axes: Sequence[Axis],
    sources: Sequence[Source],
    form: Form,
    finders: Mapping[str, Finder] | None = None,
    indexers: Mapping[str, Indexer] | None = None,
) -> Callable[..., Any]:
    """A generated lookup of ``sources`` (each keyed within ``axes``):

    * ``"dict"``: ``f(key)``, ``key`` a mapping with exactly the names of ``axes``,
      returns a new dict ``{source name: value, ..., "in_grid": bool}``;
    * ``"tuple"``: ``f(*keys)`` in the order of ``axes`` returns
      ``(value, ..., in_grid)``;
    * ``"value"``: ``f(*keys)`` returns the value of the one source.

    Outside the grid the fallbacks come from ``column_by_column``. The generated
    source holds only names it makes up and integer sizes: axis and column names
    (file data) are bound in its namespace, never written into the code.
    ``finders`` and ``indexers`` (by axis name) share the ones a table made
    already, so that a compiled lookup holds only its code and namespace.
    """
    if form == "value" and len(sources) != 1:
        raise ValueError("a value lookup reads exactly one column")
    slow = column_by_column(axes, sources, indexers)
    names = tuple(s.name for s in sources)
    ns: dict[str, Any] = {"IN": IN_GRID}
    keys = ", ".join(f"k{n}" for n in range(len(axes)))
    if form == "dict":
        lines = ["def lookup(key):"]
        lines += [f"    k{n} = key[A{n}]" for n in range(len(axes))]

        def miss_dict(*keys: Any) -> dict[str, Any]:
            out, in_grid = slow(*keys)
            result = dict(zip(names, out, strict=True))
            result[IN_GRID] = in_grid
            return result

        ns["MISS"] = miss_dict
    else:
        lines = [f"def lookup({keys}):"]
        if form == "tuple":

            def miss_tuple(*keys: Any) -> tuple[Any, ...]:
                out, in_grid = slow(*keys)
                return (*out, in_grid)

            ns["MISS"] = miss_tuple
        else:

            def miss_value(*keys: Any) -> Any:
                return slow(*keys)[0][0]

            ns["MISS"] = miss_value
    miss = f"return MISS({keys})"
    for n, axis in enumerate(axes):
        ns[f"A{n}"] = axis.name
        ns[f"F{n}"] = finders[axis.name] if finders else finder(axis)
    if axes:
        lines.append("    try:")
        lines += [f"        i{n} = F{n}(k{n})" for n in range(len(axes))]
        lines += ["    except (TypeError, ValueError):", f"        {miss}"]
    tests = [f"i{n} < {len(a.values)}" for n, a in enumerate(axes)]
    tests += [f"k{n} == k{n}" for n, a in enumerate(axes) if a.kind == "ceil"]
    lines.append(f"    if not ({' and '.join(tests) or 'True'}):")
    lines.append(f"        {miss}")
    where = {a.name: n for n, a in enumerate(axes)}
    sizes = {a.name: len(a.values) for a in axes}
    groups: dict[tuple[str, ...], str] = {}
    reads: list[str] = []
    for j, src in enumerate(sources):
        if src.axes not in groups:
            flat = "0"
            for k, name in enumerate(src.axes):
                flat = f"i{where[name]}" if k == 0 else f"({flat}) * {sizes[name]} + i{where[name]}"
            groups[src.axes] = f"g{len(groups)}"
            lines.append(f"    {groups[src.axes]} = {flat}")
        ns[f"V{j}"] = src.items
        ns[f"C{j}"] = src.name
        reads.append(f"V{j}[{groups[src.axes]}]")
    if form == "dict":
        items = [f"C{j}: {r}" for j, r in enumerate(reads)] + ["IN: True"]
        lines.append(f"    return {{{', '.join(items)}}}")
    elif form == "tuple":
        lines.append(f"    return ({''.join(r + ', ' for r in reads)}True,)")
    else:
        lines.append(f"    return {reads[0]}")
    exec(_code("\n".join(lines)), ns)
    # the function's globals are ``ns``: taking it out of them leaves no cycle
    fn: Callable[..., Any] = ns.pop("lookup")
    return fn

