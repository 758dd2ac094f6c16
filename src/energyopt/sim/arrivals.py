"""Requests to simulate: arrival time, workload, prompt and output tokens (arrays)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Arrivals:
    """Requests sorted by arrival time; ``workload`` indexes ``names``."""

    time_s: FloatArray
    workload: IntArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        n = self.time_s.shape[0]
        for arr in (self.workload, self.prompt_tokens, self.output_tokens):
            if arr.shape[0] != n:
                raise ValueError("arrival arrays differ in length")
        if n and np.any(np.diff(self.time_s) < 0):
            raise ValueError("arrival times are not sorted")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("every request has at least one prompt and one output token")

    def __len__(self) -> int:
        return int(self.time_s.shape[0])

    def before(self, end_s: float) -> Arrivals:
        """The requests arriving before ``end_s`` (s)."""
        n = int(np.searchsorted(self.time_s, end_s, side="left"))
        return Arrivals(
            self.time_s[:n],
            self.workload[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.names,
        )

    def count_between(self, start_s: float, end_s: float) -> NDArray[np.int64]:
        """Requests per workload arriving in [start_s, end_s)."""
        lo, hi = np.searchsorted(self.time_s, [start_s, end_s], side="left")
        return np.bincount(self.workload[lo:hi], minlength=len(self.names)).astype(np.int64)

    def window_rates_rps(self, start_s: float, end_s: float, window_s: float) -> FloatArray:
        """Rate of each workload (req/s) in consecutive windows of [start_s, end_s):
        shape (windows, workloads); the last window may be shorter."""
        if end_s <= start_s:
            return np.zeros((0, len(self.names)))
        edges = np.arange(start_s, end_s, window_s)
        edges = np.append(edges, end_s)
        widths = np.diff(edges)
        keep = widths > 1e-9
        lo, hi = np.searchsorted(self.time_s, [start_s, end_s], side="left")
        times = self.time_s[lo:hi]
        which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(widths) - 1)
        k = len(self.names)
        flat = np.bincount(which * k + self.workload[lo:hi], minlength=len(widths) * k)
        counts = flat.reshape(len(widths), k).astype(np.float64)
        rates = counts / widths[:, None].clip(min=1e-9)
        return np.asarray(rates[keep])

    def mean_tokens(self) -> tuple[FloatArray, FloatArray]:
        """Mean prompt and output tokens per workload (NaN where it has no request)."""
        k = len(self.names)
        count = np.bincount(self.workload, minlength=k).astype(np.float64)
        prompt = np.bincount(self.workload, weights=self.prompt_tokens, minlength=k)
        output = np.bincount(self.workload, weights=self.output_tokens, minlength=k)
        with np.errstate(invalid="ignore", divide="ignore"):
            return prompt / count, output / count

    def prompt_cv(self) -> FloatArray:
        """Coefficient of variation (standard deviation / mean) of the prompt tokens
        per workload (NaN where it has no request)."""
        k = len(self.names)
        count = np.bincount(self.workload, minlength=k).astype(np.float64)
        mean, _ = self.mean_tokens()
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = self.prompt_tokens - mean[self.workload]
            var = np.bincount(self.workload, weights=spread * spread, minlength=k) / count
            return np.asarray(np.sqrt(var) / mean)


def merge(
    parts: list[tuple[FloatArray, IntArray, IntArray, IntArray]], names: tuple[str, ...]
) -> Arrivals:
    """One sorted Arrivals from unsorted (time, workload, prompt, output) pieces."""
    if not parts:
        empty_f = np.zeros(0)
        empty_i = np.zeros(0, dtype=np.int64)
        return Arrivals(empty_f, empty_i, empty_i, empty_i, names)
    t = np.concatenate([p[0] for p in parts])
    order = np.argsort(t, kind="stable")
    return Arrivals(
        t[order],
        np.concatenate([p[1] for p in parts])[order].astype(np.int64),
        np.concatenate([p[2] for p in parts])[order].astype(np.int64),
        np.concatenate([p[3] for p in parts])[order].astype(np.int64),
        names,
    )
