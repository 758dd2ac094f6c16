"""Optimal prices of the keep-alive Lagrangian from the LP of the strengthened
arc-flow programme (formulations/milp.py with the memory covers of
formulations/cuts.py).

The Lagrangian dual max_{y >= 0} L(y) relaxes the coupling rows (node budgets,
SLO allowances, the cold-start cap and the memory covers); each function's own
rows are a shortest-path network whose LP is integral, so the dual's optimum is
the LP optimum and the LP's row duals on the coupling rows are optimal prices.
The subgradient reaches them only slowly (its steps shrink before the cover
prices, in J per member, have grown to their size); the LP gives them in one
solve where the programme is small enough to build.

The prices are used as prices, never as a bound: the Lagrangian evaluates L(y)
at them with its own shortest paths, which is a lower bound on the optimum for
any y >= 0 whatever HiGHS' tolerances, and reports that.
"""

from __future__ import annotations

import highspy
import numpy as np

from energyopt.backends.highs import mixed_lp, quiet_highs
from energyopt.families.keepalive.formulations.milp import Milp, build_milp, milp_columns
from energyopt.families.keepalive.formulations.model import FloatArray, KeepAliveProblem
from energyopt.families.keepalive.solvers.programmes import Prices

LP_COLUMNS = 400_000
"""Largest arc-flow LP (columns) the Lagrangian solves for its starting prices."""


def lp_prices(p: KeepAliveProblem, time_limit_s: float) -> tuple[Prices | None, str]:
    """Optimal prices of the coupling rows from the LP of the strengthened programme
    (None where it is larger than LP_COLUMNS, not solved to optimality within
    ``time_limit_s`` seconds, or infeasible), and a log line."""
    columns = milp_columns(p)
    if columns > LP_COLUMNS:
        return None, f"LP prices: {columns:,} columns, over {LP_COLUMNS:,}; not solved"
    if time_limit_s <= 0.05:
        return None, "LP prices: no time left"
    milp = build_milp(p, cuts=True)
    n = len(milp)
    h = quiet_highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.passModel(
        mixed_lp(
            milp.cost,
            milp.matrix,
            milp.row_lo,
            milp.row_hi,
            np.zeros(n),
            np.ones(n),
            np.zeros(n, dtype=np.bool_),
        )
    )
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return None, f"LP prices: HiGHS {h.modelStatusToString(status)}"
    # HiGHS' duals (d = c - A'y): a binding <= row has y <= 0, its price is -y
    price = np.maximum(0.0, -np.asarray(h.getSolution().row_dual))
    value = float(h.getInfo().objective_function_value)
    return _prices(p, milp, price), f"LP prices: LP optimum {value:,.1f} J"


def _prices(p: KeepAliveProblem, milp: Milp, price: FloatArray) -> Prices:
    """The Lagrangian's prices from the prices of ``build_milp``'s rows (its row
    order: flow rows, the one-move rows, budgets by kind, window and node, the
    memory covers by cover and window, the SLO rows, the cold-start cap)."""
    n_f, n_n, n_t, n_s = p.n_functions, p.n_nodes, p.n_windows, p.n_states
    offset = n_f * n_t * (n_s + 1) + n_f
    n_nt = n_t * n_n
    budgets = [
        price[offset + kind * n_nt : offset + (kind + 1) * n_nt].reshape(n_t, n_n).T
        for kind in range(3)
    ]
    offset += 3 * n_nt
    k = len(p.covers)
    cover = (
        price[offset : offset + k * n_t].reshape(k, n_t)
        / np.where(p.covers.scale > 0, p.covers.scale, 1.0)[:, None]
    )
    offset += k * n_t
    with_slo = np.flatnonzero(np.isfinite(p.slo_budget))
    slo = np.zeros(n_f)
    slo[with_slo] = price[offset : offset + len(with_slo)]
    offset += len(with_slo)
    cold = float(price[offset]) if np.isfinite(p.cold_cap) else 0.0
    assert offset + int(np.isfinite(p.cold_cap)) == milp.matrix.shape[0]
    return Prices(budgets[0], budgets[1], budgets[2], slo, cold, cover)
