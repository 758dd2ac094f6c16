"""Pairwise interference of two jobs that split one GPU's SMs (MPS).

MPS partitions the SMs but not the memory system, so two co-located jobs slow
each other through shared bandwidth, L2 cache and memory footprint. Each job is
described by the contention features of ``rates.Physics`` at its configuration.

Ground truth (the documented contention model every plan is checked against;
docs/formulations/colocation.md): while both jobs are active, job a's active time
stretches by

    S_a = 1 + mem_bound_a * max(0, bw_a + bw_b - 1)        (bandwidth oversubscribed)
            + L2_WEIGHT * bw_a * bw_b                       (cache and row-buffer conflicts)
            + FOOTPRINT_WEIGHT * footprint_a * footprint_b  (TLB and memory pressure)
            + SM_WEIGHT * occupancy_a * occupancy_b         (shared schedulers, power)

and both are active a fraction active_a * active_b of the time (independent
phases), so job a's slowdown is  sigma_a = 1 + active_a * active_b * (S_a - 1).

The optimizer does not know this function: it uses a least-squares predictor
fitted to noisy samples drawn from it (``SlowdownPredictor``); its error on
held-out pairs is measured by ``predictor_error``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from energyopt.perf.params import FloatArray

L2_WEIGHT = 0.3
FOOTPRINT_WEIGHT = 0.1
SM_WEIGHT = 0.05
SAMPLE_NOISE = 0.02
"""Standard deviation of the log of a measured slowdown around the true one."""
TRAINING_SAMPLES = 4000
TRAINING_SEED = 20240611


@dataclass(frozen=True)
class PairFeatures:
    """Features of job a (the one whose slowdown is asked) and its co-runner b."""

    active_a: FloatArray
    active_b: FloatArray
    bw_a: FloatArray
    bw_b: FloatArray
    mem_bound_a: FloatArray
    footprint_a: FloatArray
    footprint_b: FloatArray
    occupancy_a: FloatArray
    occupancy_b: FloatArray


Slowdown = Callable[[PairFeatures], FloatArray]
"""An interference model: features -> slowdown factor of job a (>= 1)."""


def true_slowdown(f: PairFeatures) -> FloatArray:
    """The ground-truth contention model (see the module docstring)."""
    stretch = (
        f.mem_bound_a * np.maximum(0.0, f.bw_a + f.bw_b - 1.0)
        + L2_WEIGHT * f.bw_a * f.bw_b
        + FOOTPRINT_WEIGHT * f.footprint_a * f.footprint_b
        + SM_WEIGHT * f.occupancy_a * f.occupancy_b
    )
    return np.asarray(1.0 + f.active_a * f.active_b * stretch)


def design_matrix(f: PairFeatures) -> FloatArray:
    """Regressors of the predictor: the overlap a_a a_b times polynomial terms."""
    overlap = f.active_a * f.active_b
    total = f.bw_a + f.bw_b
    cols = [
        np.ones_like(total),
        f.mem_bound_a,
        f.mem_bound_a * total,
        f.mem_bound_a * total**2,
        f.bw_a,
        f.bw_b,
        f.bw_a * f.bw_b,
        f.footprint_a * f.footprint_b,
        f.occupancy_a * f.occupancy_b,
    ]
    return np.stack([overlap * c for c in cols], axis=-1)


@dataclass(frozen=True)
class SlowdownPredictor:
    """Linear model on ``design_matrix`` for (slowdown - 1), clipped at 0."""

    coef: FloatArray

    def __call__(self, f: PairFeatures) -> FloatArray:
        return np.asarray(1.0 + np.maximum(design_matrix(f) @ self.coef, 0.0))


def sample_features(count: int, rng: np.random.Generator) -> PairFeatures:
    """Random pairs spanning the features of training and inference jobs."""

    def u(lo: float, hi: float) -> FloatArray:
        return rng.uniform(lo, hi, count)

    bw_a, bw_b = u(0.0, 1.0), u(0.0, 1.0)
    mem_bound_a = np.clip(bw_a + rng.normal(0.0, 0.15, count), 0.0, 1.0)
    return PairFeatures(
        active_a=u(0.3, 1.0),
        active_b=u(0.3, 1.0),
        bw_a=bw_a,
        bw_b=bw_b,
        mem_bound_a=mem_bound_a,
        footprint_a=u(0.05, 0.7),
        footprint_b=u(0.05, 0.7),
        occupancy_a=u(0.0, 1.0),
        occupancy_b=u(0.0, 1.0),
    )


def measured_slowdowns(f: PairFeatures, rng: np.random.Generator) -> FloatArray:
    """Ground truth with multiplicative log-normal measurement noise (SAMPLE_NOISE)."""
    noise = np.exp(rng.normal(0.0, SAMPLE_NOISE, f.bw_a.shape))
    return np.asarray(true_slowdown(f) * noise)


def fit_predictor(f: PairFeatures, slowdown: FloatArray) -> SlowdownPredictor:
    """Least-squares fit of (slowdown - 1) on the design matrix."""
    coef, *_ = np.linalg.lstsq(design_matrix(f), slowdown - 1.0, rcond=None)
    return SlowdownPredictor(np.asarray(coef, dtype=np.float64))


@lru_cache(maxsize=1)
def default_predictor() -> SlowdownPredictor:
    """The predictor the solvers use: fitted on TRAINING_SAMPLES measured pairs."""
    rng = np.random.default_rng(TRAINING_SEED)
    f = sample_features(TRAINING_SAMPLES, rng)
    return fit_predictor(f, measured_slowdowns(f, rng))


@dataclass(frozen=True)
class PredictionError:
    """Error of a predictor against the ground truth on some pairs."""

    pairs: int
    mape: float  # mean |predicted - true| / true, fraction
    rmse: float  # root mean squared error of the slowdown factor
    max_abs: float  # largest |predicted - true|

    def line(self) -> str:
        """One-line summary."""
        return (
            f"{self.pairs} pairs: MAPE {100 * self.mape:.2f}%, RMSE {self.rmse:.4f}, "
            f"max |error| {self.max_abs:.4f}"
        )


def prediction_error(predict: Slowdown, f: PairFeatures) -> PredictionError:
    """Error of ``predict`` against ``true_slowdown`` on the pairs ``f``."""
    truth = true_slowdown(f)
    err = predict(f) - truth
    if err.size == 0:
        return PredictionError(0, 0.0, 0.0, 0.0)
    return PredictionError(
        int(err.size),
        float(np.mean(np.abs(err) / truth)),
        float(np.sqrt(np.mean(err**2))),
        float(np.max(np.abs(err))),
    )


def predictor_error(
    predict: Slowdown | None = None, count: int = 2000, seed: int = 7
) -> PredictionError:
    """Error on fresh held-out pairs drawn like the training samples."""
    f = sample_features(count, np.random.default_rng(seed))
    return prediction_error(predict or default_predictor(), f)
