"""Constraint rows of a MILP built one at a time: ``low <= sum(v x_c) <= high``.

Formulations that add rows in loops collect them here and take the sparse matrix
and the row bounds at the end (the form ``backends.highs.solve_mip`` takes)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray


class SparseRows:
    """Rows collected in order; row k is the k-th ``add``."""

    def __init__(self) -> None:
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []
        self._lo: list[float] = []
        self._hi: list[float] = []

    def add(self, entries: Iterable[tuple[int, float]], low: float, high: float) -> None:
        """The row ``low <= sum(value x_column for (column, value) in entries) <= high``
        (an infinite bound for a one-sided row)."""
        k = len(self._lo)
        for c, v in entries:
            self._rows.append(k)
            self._cols.append(c)
            self._vals.append(v)
        self._lo.append(low)
        self._hi.append(high)

    def __len__(self) -> int:
        return len(self._lo)

    def matrix(self, width: int) -> sp.csc_matrix:
        """The coefficients, one row per ``add``, ``width`` columns."""
        return sp.csc_matrix((self._vals, (self._rows, self._cols)), shape=(len(self), width))

    def lower(self) -> NDArray[np.float64]:
        """Each row's lower bound."""
        return np.asarray(self._lo, dtype=np.float64)

    def upper(self) -> NDArray[np.float64]:
        """Each row's upper bound."""
        return np.asarray(self._hi, dtype=np.float64)
