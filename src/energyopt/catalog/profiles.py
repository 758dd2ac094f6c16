"""Measured pass profiles that override the analytic model for a (GPU, LLM) pair.

A profile is a CSV measured on one GPU type and model with whole GPUs, with a
header and one row per measurement:

    phase,tokens,context,tp,latency_ms,clock_mhz,power_w
    prefill,512,0,1,38.2,1980,612        # one prompt of 512 tokens
    decode,16,1024,1,11.9,1980,405       # one step of 16 sequences at 1024-token context
    decode,16,1024,1,13.1,1200,220

``clock_mhz`` (the locked SM clock of the row) and ``power_w`` (mean board power per
GPU while the pass runs, W) are optional columns. Without ``clock_mhz`` every row
is taken at the profile's clock (the instance's ``clock_mhz`` for the profile, else
the GPU's default clock); without ``power_w`` the power stays analytic.

For one (phase, TP) the rows of each measured clock form a grid: prefill rows are
interpolated linearly in log tokens, decode rows linearly in log batch and log
context (the nearest measurement outside their hull). Between two measured clocks
the two interpolated values are interpolated linearly in log clock; outside the
measured clocks the nearest measured clock is the reference and the analytic model
carries the rest of the way (``perf.forward``). The interpolators are built once,
when the file is read.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from energyopt.spec.errors import SpecError
from energyopt.spec.io import read_text
from energyopt.spec.workload import MAX_TP

COLUMNS = ("phase", "tokens", "context", "tp", "latency_ms")
OPTIONAL_COLUMNS = ("clock_mhz", "power_w")


@dataclass(frozen=True)
class Measured:
    """A measured (interpolated) pass: time, board power if measured, and the clock."""

    ms: float
    power_w: float | None
    clock_mhz: float


class _Grid:
    """Interpolator of log latency (and log power) over one clock's rows of one phase."""

    def __init__(self, points: NDArray[np.float64], values: NDArray[np.float64]) -> None:
        # points: (n, d) log coordinates; values: (n, 1 or 2) log latency [, log power]
        self.dim = points.shape[1]
        if self.dim == 1:
            order = np.argsort(points[:, 0])
            self.x = points[order, 0]
            self.y = values[order]
            self.linear: LinearNDInterpolator | None = None
            self.nearest: NearestNDInterpolator | None = None
            return
        self.x = points
        self.y = values
        self.linear = None
        if len(points) >= 3 and np.linalg.matrix_rank(points - points[0]) == 2:
            self.linear = LinearNDInterpolator(points, values)
        self.nearest = NearestNDInterpolator(points, values)

    def __call__(self, q: tuple[float, ...]) -> NDArray[np.float64]:
        """Log values at the log coordinates ``q``."""
        if self.dim == 1:
            return np.asarray(
                [np.interp(q[0], self.x, self.y[:, j]) for j in range(self.y.shape[1])]
            )
        point = np.asarray([q])
        if self.linear is not None:
            value = np.asarray(self.linear(point)[0], dtype=np.float64)
            if np.all(np.isfinite(value)):
                return value
        assert self.nearest is not None
        return np.asarray(self.nearest(point)[0], dtype=np.float64)


@dataclass(frozen=True)
class _Series:
    """The grids of one (phase, TP) by measured clock (ascending)."""

    clocks_mhz: tuple[float, ...]
    grids: tuple[_Grid, ...]
    has_power: bool

    def at(self, q: tuple[float, ...], clock_mhz: float) -> Measured:
        clocks = self.clocks_mhz
        if clock_mhz <= clocks[0] or len(clocks) == 1:
            values, ref = self.grids[0](q), clocks[0]
        elif clock_mhz >= clocks[-1]:
            values, ref = self.grids[-1](q), clocks[-1]
        else:
            hi = int(np.searchsorted(clocks, clock_mhz))
            lo = hi - 1
            w = (math.log(clock_mhz) - math.log(clocks[lo])) / (
                math.log(clocks[hi]) - math.log(clocks[lo])
            )
            values = (1.0 - w) * self.grids[lo](q) + w * self.grids[hi](q)
            ref = clock_mhz
        power = float(np.exp(values[1])) if self.has_power else None
        return Measured(float(np.exp(values[0])), power, float(ref))


@dataclass(frozen=True)
class MeasuredProfile:
    """Measured passes of one GPU type and model; ``clock_mhz`` is the profile's default
    clock (rows without a clock of their own)."""

    gpu: str
    model: str
    clock_mhz: float
    source: str
    prefill: dict[int, _Series] = field(default_factory=dict)
    decode: dict[int, _Series] = field(default_factory=dict)

    def prefill_at(self, tokens: float, tp: int, clock_mhz: float) -> Measured | None:
        """One prompt of ``tokens`` tokens at ``clock_mhz``; None if TP ``tp`` is not measured."""
        series = self.prefill.get(tp)
        if series is None:
            return None
        return series.at((math.log(max(tokens, 1.0)),), clock_mhz)

    def decode_at(self, batch: float, context: float, tp: int, clock_mhz: float) -> Measured | None:
        """A decode step of ``batch`` sequences at ``context`` tokens and ``clock_mhz``."""
        series = self.decode.get(tp)
        if series is None:
            return None
        q = (math.log(max(batch, 1.0)), math.log(max(context, 1.0)))
        return series.at(q, clock_mhz)

    def prefill_ms(self, tokens: float, tp: int) -> float | None:
        """Measured prefill time (ms) at the profile's clock; None if not measured."""
        m = self.prefill_at(tokens, tp, self.clock_mhz)
        return None if m is None else m.ms

    def decode_ms(self, batch: float, context: float, tp: int) -> float | None:
        """Measured decode step time (ms) at the profile's clock; None if not measured."""
        m = self.decode_at(batch, context, tp, self.clock_mhz)
        return None if m is None else m.ms


def _number(row: dict[str, str | None], name: str, problems: list[str], where: str) -> float:
    """The float in column ``name``; a problem naming the row and the column if it is not one."""
    text = (row.get(name) or "").strip()
    try:
        value = float(text)
    except ValueError:
        problems.append(f"{where}: {name}: {text!r} is not a number")
        return math.nan
    if not math.isfinite(value):
        problems.append(f"{where}: {name}: {text!r} is not a finite number")
        return math.nan
    return value


def read_profile(path: Path, gpu: str, model: str, clock_mhz: float) -> MeasuredProfile:
    """Parse a profile CSV; SpecError naming the file, the row and the column of any bad entry.

    ``clock_mhz`` is the clock of rows that have no ``clock_mhz`` column.
    """
    problems: list[str] = []
    # (phase, tp) -> clock -> rows of (log coords..., log ms[, log W])
    rows_by: dict[tuple[str, int], dict[float, list[list[float]]]] = {}
    power_cols: set[bool] = set()
    text = read_text(path)  # a FIFO or device is refused, a byte-order mark dropped
    try:
        with io.StringIO(text, newline="") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise SpecError([f"{path}: missing column(s) {', '.join(missing)}"])
            unknown = [c for c in header if c not in COLUMNS + OPTIONAL_COLUMNS]
            if unknown:
                known = ", ".join(COLUMNS + OPTIONAL_COLUMNS)
                raise SpecError([f"{path}: unknown column(s) {', '.join(unknown)} ({known})"])
            has_clock = "clock_mhz" in header
            has_power = "power_w" in header
            power_cols.add(has_power)
            for n, row in enumerate(reader, start=2):
                where = f"{path}: row {n}"
                before = len(problems)
                if None in row:
                    problems.append(f"{where}: more fields than the header has columns")
                phase = (row.get("phase") or "").strip()
                if phase not in ("prefill", "decode"):
                    problems.append(f"{where}: phase: {phase!r} must be prefill or decode")
                tokens = _number(row, "tokens", problems, where)
                context = _number(row, "context", problems, where)
                tp_value = _number(row, "tp", problems, where)
                ms = _number(row, "latency_ms", problems, where)
                clock = _number(row, "clock_mhz", problems, where) if has_clock else clock_mhz
                watts = _number(row, "power_w", problems, where) if has_power else 1.0
                checks = (
                    ("tokens", tokens, tokens >= 1, "must be at least 1"),
                    ("context", context, context >= 0, "must not be negative"),
                    (
                        "tp",
                        tp_value,
                        1 <= tp_value <= MAX_TP and tp_value == int(tp_value),
                        f"must be a whole number from 1 to {MAX_TP}",
                    ),
                    ("latency_ms", ms, ms > 0, "must be positive"),
                    ("clock_mhz", clock, clock > 0, "must be positive"),
                    ("power_w", watts, watts > 0, "must be positive"),
                )
                for name, value, ok, what in checks:
                    if math.isfinite(value) and not ok:
                        problems.append(f"{where}: {name}: {value:g} {what}")
                if len(problems) > before:
                    continue
                tp = int(tp_value)
                coords = (
                    [math.log(tokens)]
                    if phase == "prefill"
                    else [math.log(tokens), math.log(max(context, 1.0))]
                )
                values = [math.log(ms)] + ([math.log(watts)] if has_power else [])
                rows_by.setdefault((phase, tp), {}).setdefault(float(clock), []).append(
                    coords + values
                )
    except csv.Error as exc:
        raise SpecError([f"{path}: row {reader.line_num}: not a CSV row: {exc}"]) from None
    if problems:
        raise SpecError(problems)
    if not rows_by:
        raise SpecError([f"{path}: profile has no measurements"])
    has_power = power_cols == {True}
    prefill: dict[int, _Series] = {}
    decode: dict[int, _Series] = {}
    for (phase, tp), by_clock in rows_by.items():
        dims = 1 if phase == "prefill" else 2
        clocks = tuple(sorted(by_clock))
        grids = []
        for c in clocks:
            arr = np.asarray(by_clock[c], dtype=np.float64)
            # repeated measurements of one point: their mean (in logs)
            points, inverse = np.unique(arr[:, :dims], axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            sums = np.zeros((len(points), arr.shape[1] - dims), dtype=np.float64)
            np.add.at(sums, inverse, arr[:, dims:])
            counts = np.bincount(inverse, minlength=len(points)).astype(np.float64)
            grids.append(_Grid(points, sums / counts[:, None]))
        series = _Series(clocks, tuple(grids), has_power)
        (prefill if phase == "prefill" else decode)[tp] = series
    return MeasuredProfile(gpu, model, clock_mhz, str(path), prefill, decode)
