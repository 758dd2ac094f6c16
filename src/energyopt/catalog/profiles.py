"""Measured latency profiles that override the analytic model for a (GPU, LLM) pair.

A profile is a CSV measured on one GPU type and model at one SM clock with whole
GPUs, with a header and one row per measurement:

    phase,tokens,context,tp,latency_ms
    prefill,512,0,1,38.2        # one prompt of 512 tokens
    decode,16,1024,1,11.9       # one step of 16 sequences with 1024-token context

For an operating point of that pair, each forward pass takes the measured time
at the profile's clock on whole GPUs (interpolated linearly in log tokens, or
in log batch and log context; nearest measurement outside the measured range),
scaled by the analytic model's ratio between the operating point and that
reference. The analytic model thus supplies only the clock and share
dependence, which no public table measures.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from energyopt.spec.errors import SpecError

COLUMNS = ("phase", "tokens", "context", "tp", "latency_ms")


@dataclass(frozen=True)
class MeasuredProfile:
    """Measured pass latencies (ms) of one GPU type and model at ``clock_mhz``."""

    gpu: str
    model: str
    clock_mhz: float
    source: str
    prefill: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    decode: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def prefill_ms(self, tokens: float, tp: int) -> float | None:
        """Measured prefill time of one prompt of ``tokens`` tokens; None if not measured."""
        if tp not in self.prefill:
            return None
        x, y = self.prefill[tp]
        return float(np.exp(np.interp(math.log(max(tokens, 1.0)), x, y)))

    def decode_ms(self, batch: float, context: float, tp: int) -> float | None:
        """Measured decode step time for ``batch`` sequences of ``context`` tokens."""
        if tp not in self.decode:
            return None
        points, values = self.decode[tp]
        q = np.asarray([[math.log(max(batch, 1.0)), math.log(max(context, 1.0))]])
        if len(points) >= 3 and np.linalg.matrix_rank(points - points[0]) == 2:
            value = LinearNDInterpolator(points, values)(q)[0]
            if np.isfinite(value):
                return float(np.exp(value))
        return float(np.exp(NearestNDInterpolator(points, values)(q)[0]))


def read_profile(path: Path, gpu: str, model: str, clock_mhz: float) -> MeasuredProfile:
    """Parse a profile CSV; SpecError naming the file and row for any bad entry."""
    problems: list[str] = []
    pre: dict[int, list[tuple[float, float]]] = {}
    dec: dict[int, list[tuple[float, float, float]]] = {}
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise SpecError([f"{path}: missing column(s) {', '.join(missing)}"])
            for n, row in enumerate(reader, start=2):
                try:
                    phase = row["phase"].strip()
                    tokens = float(row["tokens"])
                    context = float(row["context"])
                    tp = int(row["tp"])
                    ms = float(row["latency_ms"])
                except (TypeError, ValueError) as exc:
                    problems.append(f"{path}: row {n}: {exc}")
                    continue
                if phase not in ("prefill", "decode"):
                    problems.append(f"{path}: row {n}: phase must be prefill or decode")
                elif not (tokens >= 1 and ms > 0 and tp >= 1 and context >= 0):
                    problems.append(f"{path}: row {n}: tokens, tp and latency_ms must be positive")
                elif phase == "prefill":
                    pre.setdefault(tp, []).append((math.log(tokens), math.log(ms)))
                else:
                    dec.setdefault(tp, []).append(
                        (math.log(tokens), math.log(max(context, 1.0)), math.log(ms))
                    )
    except OSError as exc:
        raise SpecError([f"{path}: cannot read profile: {exc.strerror or exc}"]) from None
    if problems:
        raise SpecError(problems)
    if not pre and not dec:
        raise SpecError([f"{path}: profile has no measurements"])
    prefill = {}
    for tp, rows in pre.items():
        arr = np.asarray(sorted(rows))
        prefill[tp] = (arr[:, 0], arr[:, 1])
    decode = {}
    for tp, drows in dec.items():
        arr = np.asarray(drows)
        decode[tp] = (arr[:, :2], arr[:, 2])
    return MeasuredProfile(gpu, model, clock_mhz, str(path), prefill, decode)
