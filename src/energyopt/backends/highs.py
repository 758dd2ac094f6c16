"""The process's HiGHS: silent instances and the thread-pool rule.

HiGHS prints a banner to fd 1 on its first instance in a process, and fixes its
thread pool at its first run (changing ``threads`` afterwards breaks every solve).
Every HiGHS instance of energyopt is made here, so that state has one owner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import highspy
import numpy as np

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
