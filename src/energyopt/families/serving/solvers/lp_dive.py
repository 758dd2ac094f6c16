"""Diving: round the configuration master's LP to integral column counts by fixing
counts and re-solving the LP from its basis."""

from __future__ import annotations

import time

import numpy as np

from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.formulations.errors import BackendFailure


def lp_dive(session: LpSession, deadline: float, batch_fraction: float = 0.9) -> bool:
    """Round the session's LP to integral counts by diving; True when it ends with
    integral counts and no unserved rate (``deadline`` a ``time.perf_counter`` value).

    Counts at or above one keep at least their integer part; then, repeatedly, the
    counts with the largest fractional part are rounded up (all with a fraction of
    at least ``batch_fraction`` at once, else the single largest; if that breaks a
    limit the count is fixed at its floor instead) and the LP is solved again from
    its basis, re-routing demand over the counts fixed so far. (Rounding the
    smallest fractions down first was tried and gives worse plans here: demand
    pushed off a column lands on partly used ones.) Bounds stay changed in the
    session.
    """
    mp = session.mp
    z_idx = np.asarray(mp.z_var, dtype=np.int32)
    lp = session.solve()
    z = lp.x[z_idx]
    for j in np.flatnonzero(z >= 1.0 - 1e-9):
        session.set_count_bounds(
            int(z_idx[j]), float(np.floor(z[j] + 1e-9)), float(mp.hi[z_idx[j]])
        )
    while time.perf_counter() < deadline:
        lp = session.solve()
        z = lp.x[z_idx]
        frac = z - np.floor(z + 1e-9)
        open_ = np.flatnonzero(frac > 1e-6)
        if open_.size == 0:
            return lp.artificial_rps <= 1e-6
        high = open_[frac[open_] >= batch_fraction]
        pick = high if high.size else open_[[int(np.argmax(frac[open_]))]]
        for j in pick:
            session.set_count_bounds(int(z_idx[j]), float(np.ceil(z[j])), float(mp.hi[z_idx[j]]))
        try:
            session.solve()
        except BackendFailure:
            for j in pick:
                session.set_count_bounds(
                    int(z_idx[j]), float(np.floor(z[j])), float(np.floor(z[j]))
                )
    return False
