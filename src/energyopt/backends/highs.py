"""The process's HiGHS: silent instances and the thread-pool rule.

HiGHS prints a banner to fd 1 on its first instance in a process, and fixes its
thread pool at its first run (changing ``threads`` afterwards breaks every solve).
Every HiGHS instance of energyopt is made here, so that state has one owner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import highspy
import numpy as np
from numpy.typing import NDArray

_BANNER_SHOWN = False

_new_highs: Callable[[], highspy.Highs] = highspy.Highs
"""``highspy.Highs`` with a typed signature (its ``__init__`` is unannotated)."""


def highs_started() -> bool:
    """Whether this process has created a HiGHS instance (through ``quiet_highs``)."""
    return _BANNER_SHOWN


def quiet_highs() -> highspy.Highs:
    """A silent HiGHS instance (the first one per process prints a banner to fd 1)."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = _new_highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = _new_highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


def single_threaded_highs() -> None:
    """Fix HiGHS' process-wide thread pool at one thread (for worker processes that
    run in parallel already); it must be the first HiGHS run of the process."""
    h = quiet_highs()
    h.setOptionValue("threads", 1)
    h.addVars(1, np.zeros(1), np.ones(1))
    h.run()


def binary_lp(
    cost: NDArray[np.float64],
    matrix: Any,
    row_lo: NDArray[np.float64],
    row_hi: NDArray[np.float64],
) -> highspy.HighsLp:
    """A 0/1 program min cost.x, row_lo <= matrix x <= row_hi as a HiGHS model
    (``matrix`` a scipy CSC matrix, one column per variable)."""
    lp = highspy.HighsLp()
    n = len(cost)
    lp.num_col_ = n
    lp.num_row_ = matrix.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = row_lo
    lp.row_upper_ = row_hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data.astype(np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    return lp
