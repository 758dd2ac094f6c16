"""Trace preparation for serverless replays: arrivals at a multiple of a trace's
rate, and the per-epoch demand (requests/s) a plan is made for.

Times are s from the trace's start, rates requests/s, tokens per request.
"""

from __future__ import annotations

import numpy as np

from energyopt.sim.arrivals import Arrivals


def replicated_trace(
    times_s: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    copies: int,
    jitter_s: float,
    seed: int,
    duration_s: float | None = None,
) -> Arrivals:
    """The trace at ``copies`` times its rate for one model: every request repeated
    ``copies`` times, each copy's arrival moved later by a uniform draw in
    [0, ``jitter_s``) (seeded), with its own prompt and output tokens. Unlike the
    serving evaluation's circular-shift superposition, this keeps the trace's
    minute-scale rate profile (its peak-to-mean ratio); only ``duration_s`` (s
    from the first request, default all) is kept."""
    rng = np.random.default_rng(seed)
    t = np.concatenate([times_s + rng.uniform(0.0, jitter_s, len(times_s)) for _ in range(copies)])
    pr = np.tile(np.asarray(prompts, dtype=np.int64), copies)
    out = np.tile(np.asarray(outputs, dtype=np.int64), copies)
    keep = np.ones(len(t), dtype=bool) if duration_s is None else t < duration_s
    order = np.argsort(t[keep], kind="stable")
    return Arrivals(
        time_s=t[keep][order],
        workload=np.zeros(int(keep.sum()), dtype=np.int64),
        prompt_tokens=np.maximum(pr[keep][order], 1),
        output_tokens=np.maximum(out[keep][order], 1),
        names=("chat",),
    )


def epoch_demand(
    arrivals: Arrivals, epoch_s: float, n_epochs: int, peak_window_s: float | None = None
) -> np.ndarray:
    """(models, epochs): requests/s of each model in each epoch: the epoch's mean, or
    with ``peak_window_s`` the largest rate over the epoch's windows of that length
    (what pools must hold for the SLOs to survive bursts inside the epoch)."""
    if peak_window_s is None:
        return np.asarray(arrivals.window_rates_rps(0.0, n_epochs * epoch_s, epoch_s).T)
    per = max(1, round(epoch_s / peak_window_s))
    fine = arrivals.window_rates_rps(0.0, n_epochs * epoch_s, epoch_s / per)
    fine = np.vstack([fine, np.zeros((n_epochs * per - fine.shape[0], fine.shape[1]))])
    return np.asarray(fine.reshape(n_epochs, per, -1).max(axis=1).T)
