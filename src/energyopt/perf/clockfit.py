"""Fit a GPU type's clock constants on a user's own clock sweep.

The sweep is a CSV (``energyopt profile`` writes one; docs/performance-model.md §8)
with one row per timed run of a fixed kernel at a locked SM clock:

    kernel,clock_mhz,flops,bytes,seconds,energy_j
    matmul,1980,8.8e14,1.2e9,1.52,1013.0
    memory,1980,0,4.0e12,1.63,598.0

``flops`` and ``bytes`` are the run's work (whole run, one GPU), ``seconds`` its wall
time and ``energy_j`` the board energy over it (the NVML energy counter's
difference). Each kernel is predicted as one pass of the model (``kernel_pass``)
and compared as ratios to its own run at the highest clock, as the Perseus sweep is
(§7), so the absolute efficiency of the kernel does not matter.

Fitted: the share of compute-bound time that does not follow the clock
(``efficiency.compute_clock_fixed``) by least squares on the log time ratios, then
the voltage floor and the knee (``power.voltage_floor``, ``power.knee_fraction``) on
the log power and energy ratios, from several starting knees.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from energyopt.perf.calibration import clock_params, on_power_curve_w
from energyopt.perf.forward import ClockResponse, kernel_pass
from energyopt.perf.params import FloatArray
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import read_text

COLUMNS = ("kernel", "clock_mhz", "flops", "bytes", "seconds", "energy_j")
KNEE_STARTS = (0.45, 0.55, 0.65, 0.75, 0.85)
MAX_ROWS = 100_000
MAX_SWEEP_BYTES = 16 * 1024 * 1024
"""A sweep file's size limit (100,000 rows of six numbers fit in a few MB)."""
POWER_RANGE = (0.2, 2.0)
"""A run's mean board power (energy_j / seconds) must lie between these multiples of
the GPU type's idle power and TDP: outside, the row is a unit or counter error (a
counter that wrapped, mJ written as J), which the fit would follow to its bounds."""
RATE_MARGIN = 4.0
"""A run may not do its flops or bytes more than this many times faster than the GPU
type's peak bf16 FLOP/s and memory bandwidth (seconds too small for the work)."""
COMPUTE_FIXED_BOUNDS = (0.0, 0.95)
FLOOR_BOUNDS = (0.3, 1.0)
KNEE_BOUNDS = (0.2, 0.98)
"""The ranges the least-squares fits search (compute_clock_fixed, voltage_floor,
knee_fraction)."""


@dataclass(frozen=True)
class KernelSweep:
    """The runs of one kernel, sorted by clock (arrays, one entry per clock)."""

    kernel: str
    clock_mhz: FloatArray
    flops: FloatArray
    bytes: FloatArray
    seconds: FloatArray
    energy_j: FloatArray

    @property
    def power_w(self) -> FloatArray:
        """Mean board power of each run (W)."""
        return np.asarray(self.energy_j / self.seconds)


def read_sweep(path: str | Path, gpu: GpuType | None = None) -> list[KernelSweep]:
    """The kernels of a sweep CSV; SpecError naming the file, row and column of every
    bad entry. Repeated (kernel, clock) rows are averaged.

    With ``gpu`` (the type measured), each row is also held to it: its clock within the
    type's range, its mean power within ``POWER_RANGE`` of idle power and TDP, and its
    work no faster than ``RATE_MARGIN`` times the type's peaks."""
    problems: list[str] = []
    rows: dict[str, dict[float, list[tuple[float, float, float, float]]]] = {}
    text = read_text(path, MAX_SWEEP_BYTES)  # a FIFO or a device is refused, not read
    if "\x00" in text:
        raise SpecError([f"{path}: cannot read: a NUL byte; not a CSV text file"])
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            header = [h.strip() for h in (reader.fieldnames or [])]
            records = list(reader)
        except csv.Error as exc:
            raise SpecError([f"{path}: row {reader.line_num}: malformed CSV: {exc}"]) from None
        missing = [c for c in COLUMNS if c not in header]
        unknown = [c for c in header if c not in COLUMNS]
        if missing:
            problems.append(
                f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(COLUMNS)})"
            )
        if unknown:
            problems.append(f"{path}: unknown column(s) {', '.join(unknown)}")
        if problems:
            raise SpecError(problems)
        for i, raw in enumerate(records, start=2):
            if i - 1 > MAX_ROWS:
                raise SpecError([f"{path}: more than {MAX_ROWS} rows"])
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            kernel = row["kernel"]
            if not kernel:
                problems.append(f"{path}: row {i}: kernel: empty")
                continue
            values: dict[str, float] = {}
            for col in COLUMNS[1:]:
                try:
                    value = float(row[col])
                except ValueError:
                    problems.append(f"{path}: row {i}: {col}: {row[col]!r} is not a number")
                    continue
                floor_ok = value >= 0 if col in ("flops", "bytes") else value > 0
                if not math.isfinite(value) or not floor_ok:
                    bound = "negative" if col in ("flops", "bytes") else "not positive"
                    problems.append(f"{path}: row {i}: {col}: {row[col]} is {bound} or not finite")
                    continue
                values[col] = value
            if len(values) < len(COLUMNS) - 1:
                continue
            if values["flops"] == 0 and values["bytes"] == 0:
                problems.append(f"{path}: row {i}: flops and bytes are both 0")
                continue
            if gpu is not None:
                implausible = implausible_row(gpu, values)
                if implausible:
                    problems.append(f"{path}: row {i}: {implausible}")
                    continue
            rows.setdefault(kernel, {}).setdefault(values["clock_mhz"], []).append(
                (values["flops"], values["bytes"], values["seconds"], values["energy_j"])
            )
    if problems:
        raise SpecError(problems)
    if not rows:
        raise SpecError([f"{path}: no rows"])
    out: list[KernelSweep] = []
    for kernel, by_clock in rows.items():
        if len(by_clock) < 3:
            raise SpecError(
                [f"{path}: kernel {kernel}: {len(by_clock)} clock(s); a fit needs 3 or more"]
            )
        clocks = sorted(by_clock)
        mean = np.asarray([np.mean(np.asarray(by_clock[c]), axis=0) for c in clocks])
        out.append(
            KernelSweep(kernel, np.asarray(clocks), mean[:, 0], mean[:, 1], mean[:, 2], mean[:, 3])
        )
    return out


def implausible_row(gpu: GpuType, values: dict[str, float]) -> str | None:
    """What makes one run's measurements impossible on ``gpu`` (``values``: the row's
    clock_mhz, flops, bytes, seconds, energy_j), naming the column; None if nothing."""
    clock = values["clock_mhz"]
    if not gpu.min_sm_clock_mhz <= clock <= gpu.max_sm_clock_mhz:
        return (
            f"clock_mhz: {clock:g} MHz is outside {gpu.name}'s "
            f"{gpu.min_sm_clock_mhz}-{gpu.max_sm_clock_mhz} MHz"
        )
    seconds = values["seconds"]
    peaks = (
        ("flops", gpu.peak_bf16_tflops * 1e12, "FLOP/s"),
        ("bytes", gpu.memory_bandwidth_gbps * 1e9, "B/s"),
    )
    for col, peak, unit in peaks:
        if values[col] / seconds > RATE_MARGIN * peak:
            return (
                f"seconds: {values[col]:g} {col} in {seconds:g} s is {values[col] / seconds:.4g} "
                f"{unit}, over {RATE_MARGIN:g} x {gpu.name}'s peak of {peak:.4g} {unit}"
            )
    power = values["energy_j"] / seconds
    low, high = POWER_RANGE[0] * gpu.idle_w, POWER_RANGE[1] * gpu.tdp_w
    if not low <= power <= high:
        return (
            f"energy_j: {values['energy_j']:g} J over {seconds:g} s is a mean power of "
            f"{power:.4g} W, outside {low:g}-{high:g} W ({POWER_RANGE[0]:g} x idle to "
            f"{POWER_RANGE[1]:g} x TDP of {gpu.name})"
        )
    return None


def fit_at_bounds(fitted: GpuType) -> list[str]:
    """The fitted constants that ended on a bound of their search (not a physical
    limit: a compute_clock_fixed of 0 or a voltage_floor of 1 is a valid answer), each
    as 'field = value (the bound)': the sweep did not determine them."""
    out = []
    compute_fixed = fitted.efficiency.compute_clock_fixed
    for label, value, bound in (
        ("efficiency.compute_clock_fixed", compute_fixed, COMPUTE_FIXED_BOUNDS[1]),
        ("power.voltage_floor", fitted.power.voltage_floor, FLOOR_BOUNDS[0]),
        ("power.knee_fraction", fitted.power.knee_fraction, KNEE_BOUNDS[0]),
        ("power.knee_fraction", fitted.power.knee_fraction, KNEE_BOUNDS[1]),
    ):
        if abs(value - bound) < 1e-3:
            out.append(f"{label} = {value:g} (the bound of its search)")
    return out


def predict(gpu: GpuType, sweep: KernelSweep) -> tuple[FloatArray, FloatArray]:
    """Model (time s, board power W) of each run of ``sweep`` on ``gpu``."""
    p = clock_params(gpu, sweep.clock_mhz, 0.0)
    clock = ClockResponse(gpu.efficiency.compute_clock_fixed, gpu.efficiency.overhead_clock_fixed)
    out = kernel_pass(p, sweep.flops, sweep.bytes, clock)
    board = on_power_curve_w(gpu, p.clock_ratio) + out.power_w
    return np.asarray(out.ms / 1e3), np.asarray(board)


def ratio_errors(gpu: GpuType, sweeps: list[KernelSweep]) -> dict[str, float]:
    """Median absolute percentage error of the time, power and energy ratios to the
    highest clock of each kernel, over every run but those at the highest clock
    (percent)."""
    errs: dict[str, list[FloatArray]] = {"time": [], "power": [], "energy": []}
    for sweep in sweeps:
        t, w = predict(gpu, sweep)
        top = int(np.argmax(sweep.clock_mhz))
        mt, mw = sweep.seconds / sweep.seconds[top], sweep.power_w / sweep.power_w[top]
        pt, pw = t / t[top], w / w[top]
        rest = np.arange(len(t)) != top
        errs["time"].append(np.abs(pt / mt - 1)[rest])
        errs["power"].append(np.abs(pw / mw - 1)[rest])
        errs["energy"].append(np.abs(pt * pw / (mt * mw) - 1)[rest])
    return {k: float(np.median(np.concatenate(v)) * 100) for k, v in errs.items()}


def with_constants(gpu: GpuType, compute_fixed: float, floor: float, knee: float) -> GpuType:
    """``gpu`` with the three clock constants replaced."""
    eff = gpu.efficiency.model_copy(update={"compute_clock_fixed": compute_fixed})
    power = gpu.power.model_copy(update={"voltage_floor": floor, "knee_fraction": knee})
    return gpu.model_copy(update={"efficiency": eff, "power": power})


def fit_clock_constants(gpu: GpuType, sweeps: list[KernelSweep]) -> GpuType:
    """``gpu`` with ``compute_clock_fixed``, ``voltage_floor`` and ``knee_fraction`` fitted
    on ``sweeps`` (see the module docs); every other field is kept."""
    for sweep in sweeps:
        top = float(sweep.clock_mhz.max())
        if top > gpu.max_sm_clock_mhz or float(sweep.clock_mhz.min()) < gpu.min_sm_clock_mhz:
            raise SpecError(
                [
                    f"kernel {sweep.kernel}: clocks {sweep.clock_mhz.min():g}-{top:g} MHz are "
                    f"outside {gpu.name}'s {gpu.min_sm_clock_mhz}-{gpu.max_sm_clock_mhz} MHz"
                ]
            )
    measured = []
    for sweep in sweeps:
        top = int(np.argmax(sweep.clock_mhz))
        measured.append(
            (np.log(sweep.seconds / sweep.seconds[top]), np.log(sweep.power_w / sweep.power_w[top]))
        )

    def time_residuals(x: FloatArray) -> FloatArray:
        trial = with_constants(gpu, float(x[0]), gpu.power.voltage_floor, gpu.power.knee_fraction)
        parts: list[FloatArray] = []
        for sweep, (lt, _) in zip(sweeps, measured, strict=True):
            t, _ = predict(trial, sweep)
            parts.append(np.log(t / t[int(np.argmax(sweep.clock_mhz))]) - lt)
        return np.concatenate(parts)

    start = np.asarray([gpu.efficiency.compute_clock_fixed], dtype=np.float64)
    lo, hi = COMPUTE_FIXED_BOUNDS
    compute_fixed = float(least_squares(time_residuals, start, bounds=([lo], [hi])).x[0])

    def power_residuals(x: FloatArray) -> FloatArray:
        trial = with_constants(gpu, compute_fixed, float(x[0]), float(x[1]))
        parts: list[FloatArray] = []
        for sweep, (lt, lw) in zip(sweeps, measured, strict=True):
            t, w = predict(trial, sweep)
            top = int(np.argmax(sweep.clock_mhz))
            pt, pw = np.log(t / t[top]), np.log(w / w[top])
            parts += [pw - lw, (pt + pw) - (lt + lw)]
        return np.concatenate(parts)

    best: tuple[float, FloatArray] | None = None
    for knee in KNEE_STARTS:
        x0 = np.asarray([gpu.power.voltage_floor, knee], dtype=np.float64)
        res = least_squares(
            power_residuals,
            x0,
            bounds=([FLOOR_BOUNDS[0], KNEE_BOUNDS[0]], [FLOOR_BOUNDS[1], KNEE_BOUNDS[1]]),
        )
        if best is None or float(res.cost) < best[0]:
            best = (float(res.cost), np.asarray(res.x))
    assert best is not None
    floor, knee = (round(float(v), 4) for v in best[1])
    return with_constants(gpu, round(compute_fixed, 4), floor, knee)


def catalog_entry(fitted: GpuType, source: str, rows: int) -> dict[str, object]:
    """A catalog file (``gpus:`` list) holding ``fitted``, its fitted fields cited."""
    entry = fitted.model_dump(mode="json", exclude_none=True)
    note = f"fitted by energyopt calibrate on {source} ({rows} runs; ratios to the highest clock)"
    sources = dict(fitted.sources)
    sources["efficiency.compute_clock_fixed"] = note
    sources["power.voltage_floor"] = note
    sources["power.knee_fraction"] = note
    entry["sources"] = sources
    return {"gpus": [entry]}
