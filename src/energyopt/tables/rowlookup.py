"""Precompiled scalar lookups: one closure per tuple of key names, returning a packed
row (a tuple, or a dict) of every column those keys index, without numpy scalars.

Every key maps to an axis position with a C-level call (a dict subscript for
``category`` and ``exact`` axes, ``bisect_left`` for ``ceil`` axes); a position equal
to the axis length means outside the grid. The row of every in-grid combination of
positions is built once (Python objects), so a lookup is a few subscripts and one
list index. Anything unusual (a key outside the grid, NaN, a key of the wrong type)
goes to the ``miss`` function, which never raises.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from energyopt.tables.stdlib_reader import Axis

Finder = Callable[[Any], int]
ROW_LIMIT = 1 << 19
"""Most rows a precompiled lookup materializes; larger key spaces use the slow path."""


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


def compile_rows(
    finders: Sequence[Finder],
    sizes: Sequence[int],
    rows: list[Any],
    miss: Callable[..., Any],
) -> Callable[..., Any]:
    """``f(*keys)`` -> ``rows[flat]`` where flat is the C-order position of the keys'
    positions on axes of ``sizes``; ``miss(*keys)`` when any key is outside its axis,
    NaN, or of a type its axis cannot compare."""
    n = len(finders)
    if n == 1:
        (f0,), (n0,) = finders, sizes

        def get1(k0: Any) -> Any:
            try:
                i0 = f0(k0)
            except TypeError:
                return miss(k0)
            if i0 < n0 and k0 == k0:
                return rows[i0]
            return miss(k0)

        return get1
    if n == 2:
        (f0, f1), (n0, n1) = finders, sizes

        def get2(k0: Any, k1: Any) -> Any:
            try:
                i0, i1 = f0(k0), f1(k1)
            except TypeError:
                return miss(k0, k1)
            if i0 < n0 and i1 < n1 and k0 == k0 and k1 == k1:
                return rows[i0 * n1 + i1]
            return miss(k0, k1)

        return get2
    if n == 3:
        (f0, f1, f2), (n0, n1, n2) = finders, sizes

        def get3(k0: Any, k1: Any, k2: Any) -> Any:
            try:
                i0, i1, i2 = f0(k0), f1(k1), f2(k2)
            except TypeError:
                return miss(k0, k1, k2)
            if i0 < n0 and i1 < n1 and i2 < n2 and k0 == k0 and k1 == k1 and k2 == k2:
                return rows[(i0 * n1 + i1) * n2 + i2]
            return miss(k0, k1, k2)

        return get3
    if n == 4:
        (f0, f1, f2, f3), (n0, n1, n2, n3) = finders, sizes

        def get4(k0: Any, k1: Any, k2: Any, k3: Any) -> Any:
            try:
                i0, i1, i2, i3 = f0(k0), f1(k1), f2(k2), f3(k3)
            except TypeError:
                return miss(k0, k1, k2, k3)
            if (
                i0 < n0
                and i1 < n1
                and i2 < n2
                and i3 < n3
                and k0 == k0
                and k1 == k1
                and k2 == k2
                and k3 == k3
            ):
                return rows[((i0 * n1 + i1) * n2 + i2) * n3 + i3]
            return miss(k0, k1, k2, k3)

        return get4
    pairs = list(zip(finders, sizes, strict=True))

    def get(*keys: Any) -> Any:
        flat = 0
        try:
            for (f, size), k in zip(pairs, keys, strict=True):
                i = f(k)
                if i >= size or k != k:
                    return miss(*keys)
                flat = flat * size + i
        except (TypeError, ValueError):
            return miss(*keys)
        return rows[flat]

    return get


def by_name(names: Sequence[str], positional: Callable[..., Any]) -> Callable[[Any], Any]:
    """``f(key)`` for a mapping ``key`` with ``names``: ``positional`` of its values in
    that order (subscripts are cheaper than unpacking ``key.values()``)."""
    if len(names) == 1:
        (a,) = names
        return lambda key: positional(key[a])
    if len(names) == 2:
        a, b = names
        return lambda key: positional(key[a], key[b])
    if len(names) == 3:
        a, b, c = names
        return lambda key: positional(key[a], key[b], key[c])
    if len(names) == 4:
        a, b, c, d = names
        return lambda key: positional(key[a], key[b], key[c], key[d])
    order = tuple(names)
    return lambda key: positional(*[key[n] for n in order])
