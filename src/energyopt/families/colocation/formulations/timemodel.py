"""The time model of a unit: when its jobs finish and how much work is done by a time.

Jobs arrive at time 0. A unit starts at its start time; each job runs at its
rate divided by its slowdown while its partner runs, and at its full rate (the
same share, now without a co-runner) once the partner has finished. A job alone
has slowdown 1. Formulations, solvers and the checker all use these formulas.
"""

from __future__ import annotations

import numpy as np

from energyopt.perf.params import FloatArray


def pair_durations(
    work_a: FloatArray,
    rate_a: FloatArray,
    sigma_a: FloatArray,
    work_b: FloatArray,
    rate_b: FloatArray,
    sigma_b: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Run times (s) of the two jobs of a unit from its start.

    ``work`` in work units, ``rate`` in work units per second alone, ``sigma``
    the slowdown while both run. A job with zero work takes zero time (a job
    alone is a pair with an empty partner).
    """
    xa = work_a * sigma_a / rate_a  # finish of a if b ran throughout
    xb = work_b * sigma_b / rate_b
    first = np.minimum(xa, xb)
    da = np.where(xa <= xb, xa, first + work_a / rate_a - first / sigma_a)
    db = np.where(xb < xa, xb, first + work_b / rate_b - first / sigma_b)
    return np.asarray(da), np.asarray(db)


def progress_by(
    elapsed_s: FloatArray,
    work: FloatArray,
    rate: FloatArray,
    sigma: FloatArray,
    overlap_s: FloatArray,
) -> FloatArray:
    """Fraction of a job's work done ``elapsed_s`` after its unit started.

    The job runs at ``rate / sigma`` for the first ``overlap_s`` seconds (while
    both jobs of the unit run) and at ``rate`` after that.
    """
    t = np.maximum(elapsed_s, 0.0)
    slow = np.minimum(t, overlap_s)
    done = rate / sigma * slow + rate * np.maximum(t - overlap_s, 0.0)
    return np.asarray(np.minimum(done / work, 1.0))
