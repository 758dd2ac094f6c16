"""Projected subgradient with Polyak steps: the one implementation behind the
serving shadow prices and the co-location Lagrangian dual.

Maximising a concave dual L(y) over prices y (non-negative, except on rows marked
free): with g a subgradient at y and a target T above the best value,

    y <- P( y + theta * max(T - L(y), min_gap) / ||g||^2 * g ),

where P clips the non-free prices at 0, and components of g that would push a
zero price below 0 are dropped first (they cannot move). theta halves after
``patience`` evaluations without an improvement of the best L.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass
class PolyakControl:
    """Step factor and the best dual value seen; ``observe`` after every evaluation."""

    theta: float = 1.0
    patience: int = 10
    rel_improvement: float = 1e-12
    best_value: float = -np.inf
    stall: int = 0

    def observe(self, value: float) -> bool:
        """Record L at the current prices; True when it improves on the best."""
        threshold = self.best_value + self.rel_improvement * max(1.0, abs(value))
        if not np.isfinite(self.best_value) or value > threshold:
            self.best_value = value
            self.stall = 0
            return True
        self.stall += 1
        if self.stall >= self.patience:
            self.theta /= 2.0
            self.stall = 0
        return False


def projected_step(
    prices: FloatArray,
    g: FloatArray,
    value: float,
    target: float,
    theta: float,
    free: BoolArray | None = None,
    min_gap: float = 0.0,
) -> tuple[FloatArray, float]:
    """(new prices, ||g||^2 of the movable direction); prices unchanged when it is 0."""
    bounded = np.ones(len(prices), dtype=bool) if free is None else ~free
    g = np.where(bounded & (prices <= 0.0) & (g < 0.0), 0.0, g)
    norm2 = float(g @ g)
    if norm2 <= 1e-18:
        return prices, norm2
    size = theta * max(target - value, min_gap) / norm2
    new = prices + size * g
    new[bounded] = np.maximum(new[bounded], 0.0)
    return np.asarray(new, dtype=np.float64), norm2
