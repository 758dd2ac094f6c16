"""Lagrangian dual of the per-job relaxation, maximized by projected subgradient.

For prices y (>= 0 on inequality rows, free on balance rows) the dual function

    L(y) = sum_j min( min_c [cost_c + usage_c . y],  0 if the job may stay out )
           - sum_{inequality rows} y_r

is a lower bound on the relaxation's optimum for every y, so the best L seen is
a valid bound. Price update (Polyak step, halving the step factor theta when L
has not improved for ``patience`` iterations):

    y <- P( y + theta * (UB - L(y)) / ||g||^2 * g ),   g = usage(x(y)) - rhs

where x(y) is each job's cheapest column at y, UB the best plan's objective,
rhs 1 on inequality rows and 0 on balance rows, and P clips inequality prices
at 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from energyopt.families.colocation.formulations.relaxation import Relaxation
from energyopt.perf.params import FloatArray
from energyopt.solvers.subgradient import PolyakControl, projected_step

IntArray = NDArray[np.int64]


@dataclass
class DualPoint:
    """The dual function at some prices: value, each job's choice (-1: none), subgradient."""

    value: float
    choice: IntArray
    subgradient: FloatArray


@dataclass
class Subgradient:
    """State of the projected subgradient method on one relaxation."""

    relax: Relaxation
    theta: float = 1.0
    patience: int = 10
    prices: FloatArray = field(init=False)
    best_value: float = field(init=False, default=-np.inf)
    best_prices: FloatArray = field(init=False)
    history: list[float] = field(init=False, default_factory=list)
    _bounds: IntArray = field(init=False)
    _jobs: IntArray = field(init=False)
    _control: PolyakControl = field(init=False)

    def __post_init__(self) -> None:
        r = self.relax
        self.prices = np.zeros(r.usage.shape[0])
        self.best_prices = self.prices.copy()
        sorted_jobs = np.sort(r.job)
        self._bounds = np.flatnonzero(np.r_[True, np.diff(sorted_jobs) != 0])
        self._jobs = sorted_jobs[self._bounds]
        self._control = PolyakControl(self.theta, self.patience)

    def evaluate(self, prices: FloatArray) -> DualPoint:
        """L(prices), the minimizing columns and a subgradient."""
        r = self.relax
        priced = r.cost + r.usage.T @ prices
        best = np.lexsort((priced, r.job))[self._bounds]  # cheapest column of each job
        mins = priced[best]
        take = mins < 0.0 if r.optional else np.ones(len(mins), dtype=bool)
        choice = np.full(r.n_jobs, -1, dtype=np.int64)
        choice[self._jobs[take]] = best[take]
        value = float(np.where(take, mins, 0.0).sum() - prices[~r.equality].sum())
        x = np.zeros(len(r.cost))
        chosen = choice[choice >= 0]
        x[chosen] = 1.0
        rhs = np.where(r.equality, 0.0, 1.0)
        sub = np.asarray(r.usage @ x - rhs)
        return DualPoint(value, choice, sub)

    def step(self, upper: float) -> DualPoint:
        """Evaluate at the current prices, then move them by the Polyak rule."""
        point = self.evaluate(self.prices)
        self.history.append(point.value)
        if self._control.observe(point.value):
            self.best_value = point.value
            self.best_prices = self.prices.copy()
        target = upper if np.isfinite(upper) else point.value + abs(point.value) * 0.1 + 1.0
        self.prices, _ = projected_step(
            self.prices,
            point.subgradient,
            point.value,
            target,
            self._control.theta,
            free=self.relax.equality,
        )
        self.theta = self._control.theta
        return point
