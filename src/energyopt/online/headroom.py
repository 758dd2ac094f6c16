"""Forecast headroom from the observed forecast error of the recent past, per workload.

After every epoch the raw forecast made for it (requests/s, before headroom) is
compared with the rate measured in each ``window_s`` window of that epoch: the
error sample is ``observed / forecast - 1``. The headroom of a workload is ``1 +``
the ``quantile`` of its samples of the last ``epochs`` epochs, clipped to
[``min_headroom``, ``max_headroom``] (below 1 when even that quantile of the
observed rates is below the forecast: the trend forecast takes the highest
window of the past, so it often overshoots); until ``min_samples`` samples exist, the configured
fixed headroom is used.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

from energyopt.perf.params import FloatArray


class ErrorHeadroom:
    """Per-workload headroom from forecast-error quantiles (see module docs)."""

    def __init__(
        self,
        workloads: int,
        *,
        quantile: float = 0.9,
        epochs: int = 3,
        default: float = 1.1,
        max_headroom: float = 2.0,
        min_headroom: float = 1.0,
        min_samples: int = 5,
    ) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile {quantile} is not in (0, 1)")
        self.quantile = quantile
        self.default = default
        self.max_headroom = max_headroom
        self.min_headroom = min_headroom
        self.min_samples = min_samples
        self.history: list[deque[FloatArray]] = [deque(maxlen=epochs) for _ in range(workloads)]

    def record(self, forecast_rps: FloatArray, observed_rps: FloatArray) -> None:
        """Errors of one epoch: ``forecast_rps`` per workload, ``observed_rps`` the
        measured window rates, shape (windows, workloads). A workload forecast at 0
        req/s gives no samples."""
        obs = np.asarray(observed_rps, dtype=np.float64)
        if obs.ndim != 2 or obs.shape[0] == 0:
            return
        for k, hist in enumerate(self.history):
            f = float(forecast_rps[k])
            if f > 0:
                hist.append(obs[:, k] / f - 1.0)

    def spread(self) -> FloatArray:
        """Per workload, how far above its typical window rate a window's rate goes: the
        ``quantile`` of its samples' ``1 + error`` over their median, minus 1, clipped
        to [0, ``max_headroom`` - 1]; ``max_headroom`` - 1 until ``min_samples``
        samples exist (nothing is known of the load's swings yet). Fractions; the
        forecast's bias (the median error) cancels, so it applies to an observed rate
        (the online control's harvest margin)."""
        top = self.max_headroom - 1.0
        out = np.full(len(self.history), top)
        for k, hist in enumerate(self.history):
            if not hist:
                continue
            samples = np.concatenate(list(hist))
            if samples.size < self.min_samples:
                continue
            typical = 1.0 + float(np.median(samples))
            high = 1.0 + float(np.quantile(samples, self.quantile))
            out[k] = top if typical <= 0.0 else min(max(high / typical - 1.0, 0.0), top)
        return out

    def known(self) -> NDArray[np.bool_]:
        """Per workload, whether ``min_samples`` samples exist (``spread`` and
        ``headroom`` come from them, not from the defaults)."""
        return np.asarray(
            [sum(h.size for h in hist) >= self.min_samples for hist in self.history],
            dtype=np.bool_,
        )

    def headroom(self) -> FloatArray:
        """Multiplier of each workload's raw forecast."""
        out = np.full(len(self.history), self.default)
        for k, hist in enumerate(self.history):
            if not hist:
                continue
            samples = np.concatenate(list(hist))
            if samples.size < self.min_samples:
                continue
            q = float(np.quantile(samples, self.quantile))
            out[k] = min(max(1.0 + q, self.min_headroom), self.max_headroom)
        return out
