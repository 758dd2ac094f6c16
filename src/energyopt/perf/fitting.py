"""Fit a GPU's efficiency and power constants to the measured tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from energyopt.catalog.loader import Catalog
from energyopt.perf.calibration import (
    H100NVL_STEPS,
    SPLITWISE_HARDWARE,
    SPLITWISE_MODELS,
    VIDUR_HARDWARE,
    VIDUR_MODELS,
    VIDUR_NETWORK,
    AllReduceRows,
    ClockSweep,
    ErrorStats,
    HostBoundRun,
    PerseusPass,
    PowerConstants,
    SplitwiseRows,
    error_stats,
    h100_nvl,
    phase_power_w,
    predict_allreduce_ms,
    predict_h100nvl,
    predict_perseus,
    predict_splitwise,
    predict_vidur_layer_ms,
    read_allreduce,
    read_h100nvl,
    read_h100nvl_top_seconds,
    read_perseus,
    read_power_constants,
    read_splitwise,
    read_vidur,
    splitwise_average_power,
    splitwise_stack_ms,
)
from energyopt.perf.forward import CLOCK_RESPONSE, ClockResponse
from energyopt.perf.params import FloatArray
from energyopt.spec.hardware import Efficiency, GpuType, PowerParams
from energyopt.spec.llm import LlmModel


@dataclass(frozen=True)
class Tables:
    """Where the shared measurement tables are."""

    root: Path

    @property
    def splitwise(self) -> Path:
        return self.root / "profiles" / "splitwise" / "perf_model.csv"

    @property
    def power(self) -> Path:
        return self.root / "profiles" / "splitwise" / "power_model_constant.yaml"

    def allreduce(self, gpu: str) -> Path | None:
        """Vidur's NCCL all-reduce table of catalog GPU ``gpu`` (None if it has none)."""
        for folder, name in VIDUR_NETWORK.items():
            path = self.root / "network" / "vidur" / folder / "all_reduce.csv"
            if name == gpu and path.exists():
                return path
        return None

    def vidur(self) -> list[tuple[str, str, Path]]:
        """(catalog GPU, catalog model, file) of every Vidur table."""
        out = []
        for hw_dir, gpu in VIDUR_HARDWARE.items():
            for path in sorted((self.root / "profiles" / "vidur" / hw_dir).glob("*.mlp.csv")):
                name = path.name.removesuffix(".mlp.csv")
                if name in VIDUR_MODELS:
                    out.append((gpu, VIDUR_MODELS[name], path))
        return out


def splitwise_tables(
    catalog: Catalog, tables: Tables, gpu: GpuType
) -> Iterator[tuple[str, str, LlmModel, SplitwiseRows]]:
    """(hardware, model name, catalog model, rows) of every Splitwise table of ``gpu``."""
    for hw, gname in SPLITWISE_HARDWARE.items():
        if gname != gpu.name:
            continue
        for mname, cname in SPLITWISE_MODELS.items():
            rows = read_splitwise(tables.splitwise, hw, mname)
            if rows.tp:
                yield hw, mname, catalog.model(cname), rows


def latency_errors(
    catalog: Catalog, tables: Tables, gpu: GpuType, stack_ms: float | None = None
) -> list[ErrorStats]:
    """Error of the latency model of ``gpu`` on every table that measured it (Splitwise
    through its stack latency ``stack_ms``, default ``SPLITWISE_STACK_MS``)."""
    stats: list[ErrorStats] = []
    for hw, mname, model, rows in splitwise_tables(catalog, tables, gpu):
        pre, dec = predict_splitwise(gpu, model, rows, stack_ms)
        stats.append(error_stats(f"splitwise {hw} {mname} prompt", pre.ms, rows.prompt_ms))
        stats.append(error_stats(f"splitwise {hw} {mname} token", dec.ms, rows.token_ms))
    for gname, cname, path in tables.vidur():
        if gname != gpu.name:
            continue
        rows_v = read_vidur(path)
        pred = predict_vidur_layer_ms(gpu, catalog.model(cname), rows_v)
        stats.append(error_stats(f"vidur {path.parent.name} {path.name}", pred, rows_v.layer_ms))
    ar_path = tables.allreduce(gpu.name)
    if ar_path is not None:
        ar = read_allreduce(ar_path)
        pred_ar = predict_allreduce_ms(gpu, ar)
        stats.append(error_stats(f"vidur {ar_path.parent.name} all_reduce", pred_ar, ar.ms))
    return stats


def power_errors(
    catalog: Catalog, tables: Tables, gpu: GpuType, stack_ms: float | None = None
) -> list[ErrorStats]:
    """Error of the power model against Splitwise's constants and average-power rows."""
    stats: list[ErrorStats] = []
    hw = next((k for k, v in SPLITWISE_HARDWARE.items() if v == gpu.name), None)
    if hw is None:
        return stats
    const = read_power_constants(tables.power, hw)
    prompt_w, token_w = phase_power_w(gpu, catalog.model("Llama-2-70B"), stack_ms=stack_ms)
    stats.append(
        error_stats(
            f"splitwise {hw} prompt power", np.asarray([prompt_w]), np.asarray([const.prompt_w])
        )
    )
    stats.append(
        error_stats(
            f"splitwise {hw} token power", np.asarray([token_w]), np.asarray([const.token_w])
        )
    )
    for mname, cname in SPLITWISE_MODELS.items():
        rows = read_splitwise(tables.splitwise, hw, mname)
        keep = rows.avg_power_frac > 0
        if not keep.any():
            continue
        pred = splitwise_average_power(gpu, catalog.model(cname), rows, stack_ms)
        stats.append(
            error_stats(
                f"splitwise {hw} {mname} average power", pred[keep], rows.avg_power_frac[keep]
            )
        )
    return stats


def fit_allreduce(tables: Tables, gpu: GpuType) -> Efficiency:
    """All-reduce latency and achieved link efficiency of ``gpu`` from Vidur's NCCL
    measurement inside one node: least squares on log time over every message size and
    group size (``predict_allreduce_ms``). Bounds [0, 5] ms and [0.01, 1]; rounded to 4
    decimals. A type with no such table keeps its values."""
    path = tables.allreduce(gpu.name)
    if path is None:
        return gpu.efficiency
    rows: AllReduceRows = read_allreduce(path)

    def trial(x: np.ndarray) -> GpuType:
        eff = gpu.efficiency.model_copy(
            update={"allreduce_latency_ms": float(x[0]), "link": float(x[1])}
        )
        return gpu.model_copy(update={"efficiency": eff})

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.log(predict_allreduce_ms(trial(x), rows) / rows.ms))

    sol = least_squares(residuals, np.asarray([0.03, 0.3]), bounds=([0.0, 0.01], [5.0, 1.0]))
    x = [round(float(v), 4) for v in sol.x]
    return trial(np.asarray(x)).efficiency


def fit_latency(catalog: Catalog, tables: Tables, gpu: GpuType) -> tuple[Efficiency, float]:
    """Least squares on log latency over every latency table of ``gpu``: the compute and
    memory efficiencies, the per-pass overhead and Splitwise's stack latency per
    all-reduce (``SPLITWISE_STACK_MS``, returned second). The all-reduce latency and link
    efficiency stay as given (``fit_allreduce`` sets them first)."""

    def trial_of(x: np.ndarray) -> GpuType:
        eff = gpu.efficiency.model_copy(
            update={
                "compute": float(x[0]),
                "memory": float(x[1]),
                "step_overhead_ms": float(x[2]),
            }
        )
        return gpu.model_copy(update={"efficiency": eff})

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = trial_of(x)
        res: list[np.ndarray] = []
        for _, _, model, rows in splitwise_tables(catalog, tables, gpu):
            pre, dec = predict_splitwise(trial, model, rows, float(x[3]))
            res.append(np.log(pre.ms / rows.prompt_ms))
            res.append(np.log(dec.ms / rows.token_ms))
        for gname, cname, path in tables.vidur():
            if gname == gpu.name:
                rows_v = read_vidur(path)
                pred = predict_vidur_layer_ms(trial, catalog.model(cname), rows_v)
                res.append(np.log(pred / rows_v.layer_ms))
        return np.concatenate(res)

    e = gpu.efficiency
    x0 = np.asarray([e.compute, e.memory, max(e.step_overhead_ms, 0.5), 0.05])
    sol = least_squares(residuals, x0, bounds=([0.05, 0.05, 0.0, 0.0], [1.0, 1.0, 50.0, 5.0]))
    x = [round(float(v), 4) for v in sol.x]
    return trial_of(np.asarray(x)).efficiency, x[3]


def fit_power(
    catalog: Catalog, gpu: GpuType, const: PowerConstants, stack_ms: float | None = None
) -> PowerParams:
    """SM share of dynamic power and SM activity of memory-bound work, from prompt/token power
    (passes through Splitwise's stack, ``stack_ms`` per all-reduce)."""
    model = catalog.model("Llama-2-70B")
    stack = splitwise_stack_ms(gpu) if stack_ms is None else stack_ms

    def residuals(x: np.ndarray) -> np.ndarray:
        power = gpu.power.model_copy(
            update={"sm_fraction": float(x[0]), "memory_bound_sm_activity": float(x[1])}
        )
        trial = gpu.model_copy(update={"power": power})
        prompt_w, token_w = phase_power_w(trial, model, stack_ms=stack)
        return np.asarray([prompt_w / const.prompt_w - 1.0, token_w / const.token_w - 1.0])

    sol = least_squares(residuals, np.asarray([0.85, 0.45]), bounds=([0.3, 0.0], [1.0, 1.0]))
    return gpu.power.model_copy(
        update={
            "sm_fraction": round(float(sol.x[0]), 4),
            "memory_bound_sm_activity": round(float(sol.x[1]), 4),
        }
    )


# ---------------------------------------------------------------------------
# Clock dimension (../shared/data/dvfs)

PERSEUS_BLOCKING_W = 83.64
"""Power of an A100 SXM with its clock locked, waiting on communication (W), as the
Perseus artifact states it (shared data README)."""


def perseus_passes(tables: Tables) -> list[PerseusPass]:
    """Every pass of every Perseus file under ``dvfs/perseus-a100``."""
    out: list[PerseusPass] = []
    for path in sorted((tables.root / "dvfs" / "perseus-a100").glob("*+a100_sxm_bf16.csv")):
        out.extend(read_perseus(path))
    return out


def h100nvl_path(tables: Tables) -> Path:
    """The H100 NVL sweep file."""
    return tables.root / "dvfs" / "h100nvl-llama7b" / "h100nvl_llama7b_hf_dvfs.csv"


@dataclass(frozen=True)
class SweepErrors:
    """Error of the model on one clock sweep: APE of the ratios and the optimal clock."""

    name: str
    time: ErrorStats
    power: ErrorStats
    energy: ErrorStats
    measured_opt_mhz: float
    model_opt_mhz: float

    @property
    def opt_error_mhz(self) -> float:
        """|model - measured| energy-optimal clock (MHz)."""
        return abs(self.model_opt_mhz - self.measured_opt_mhz)


def _sweep_errors(
    sweep: ClockSweep, pred: tuple[FloatArray, FloatArray, FloatArray]
) -> SweepErrors:
    t, p, e = pred
    return SweepErrors(
        sweep.name,
        error_stats(f"{sweep.name} time ratio", t, sweep.time_ratio),
        error_stats(f"{sweep.name} power ratio", p, sweep.power_ratio),
        error_stats(f"{sweep.name} energy ratio", e, sweep.energy_ratio),
        sweep.optimal_clock_mhz,
        float(sweep.clock_mhz[int(np.argmin(e))]),
    )


def perseus_errors(
    tables: Tables, a100: GpuType, clock: ClockResponse = CLOCK_RESPONSE
) -> list[SweepErrors]:
    """Error of the model of ``a100`` on every Perseus pass."""
    return [_sweep_errors(s.sweep, predict_perseus(a100, s, clock)) for s in perseus_passes(tables)]


def perseus_pooled_errors(
    tables: Tables, a100: GpuType, clock: ClockResponse = CLOCK_RESPONSE
) -> tuple[ErrorStats, ErrorStats, ErrorStats]:
    """APE of the (time, power, energy) ratios over every point of every Perseus pass."""
    preds = [(s.sweep, predict_perseus(a100, s, clock)) for s in perseus_passes(tables)]
    out: list[ErrorStats] = []
    for i, kind in enumerate(("time", "power", "energy")):
        pred = np.concatenate([p[i] for _, p in preds])
        meas = np.concatenate([(s.time_ratio, s.power_ratio, s.energy_ratio)[i] for s, _ in preds])
        out.append(error_stats(f"perseus a100 (all passes) {kind} ratio", pred, meas))
    return out[0], out[1], out[2]


H100NVL_RUN = HostBoundRun(host_ms=50.93, gpu_overhead_ms=22.78, window_s=54.2)
"""Fitted software constants of the H100 NVL sweep (``fit_h100nvl``; not GPU constants)."""


def h100nvl_errors(
    tables: Tables,
    h100: GpuType,
    run: HostBoundRun = H100NVL_RUN,
    clock: ClockResponse = CLOCK_RESPONSE,
) -> SweepErrors:
    """Error of the model of the H100 (as an H100 NVL) on the H100 NVL sweep."""
    sweep = read_h100nvl(h100nvl_path(tables))
    return _sweep_errors(sweep, predict_h100nvl(h100_nvl(h100), sweep, run, clock))


def _log_ratio_residuals(
    sweep: ClockSweep, pred: tuple[FloatArray, FloatArray, FloatArray]
) -> FloatArray:
    t, p, e = pred
    return np.concatenate(
        [
            np.log(t / sweep.time_ratio),
            np.log(p / sweep.power_ratio),
            np.log(e / sweep.energy_ratio),
        ]
    )


def fit_perseus(
    tables: Tables, a100: GpuType, clock: ClockResponse = CLOCK_RESPONSE
) -> tuple[PowerParams, ClockResponse]:
    """Voltage floor, knee and the clock-independent share of compute time, on Perseus.

    Least squares on the log time, power and energy ratios of every pass; the static
    power ``locked_clock_w`` is the Perseus blocking power less idle, and the memory
    share of power comes from ``HBM_PJ_PER_BIT``. Started from a grid of knees, the
    best solution is kept (the knee makes the problem non-convex).
    """
    passes = perseus_passes(tables)
    static = static_power_w(a100)

    def trial(x: np.ndarray) -> tuple[GpuType, ClockResponse]:
        power = a100.power.model_copy(
            update={
                "voltage_floor": float(x[0]),
                "knee_fraction": float(x[1]),
                "locked_clock_w": static,
            }
        )
        return a100.model_copy(update={"power": power}), ClockResponse(
            compute_fixed=float(x[2]), overhead_fixed=clock.overhead_fixed
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        gpu, resp = trial(x)
        return np.concatenate(
            [_log_ratio_residuals(s.sweep, predict_perseus(gpu, s, resp)) for s in passes]
        )

    best = None
    for knee in (0.5, 0.6, 0.7, 0.8):
        sol = least_squares(
            residuals,
            np.asarray([0.75, knee, 0.2]),
            bounds=([0.3, 0.3, 0.0], [1.0, 0.98, 0.6]),
        )
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    x = [round(float(v), 4) for v in best.x]
    gpu, resp = trial(np.asarray(x))
    return gpu.power, resp


def fit_h100nvl(
    tables: Tables, h100: GpuType, clock: ClockResponse = CLOCK_RESPONSE
) -> tuple[PowerParams, ClockResponse, HostBoundRun]:
    """H100 voltage floor and knee, and the host share of the per-pass overhead, on the
    H100 NVL sweep (with the sweep's own host time, eager-kernel overhead and power
    window). The host time is the measured time at the max clock over the steps."""
    path = h100nvl_path(tables)
    sweep = read_h100nvl(path)
    host_ms = read_h100nvl_top_seconds(path) / H100NVL_STEPS * 1e3

    def trial(x: np.ndarray) -> tuple[GpuType, ClockResponse, HostBoundRun]:
        power = h100.power.model_copy(
            update={"voltage_floor": float(x[0]), "knee_fraction": float(x[1])}
        )
        resp = ClockResponse(compute_fixed=clock.compute_fixed, overhead_fixed=float(x[2]))
        run = HostBoundRun(host_ms=host_ms, gpu_overhead_ms=float(x[3]), window_s=float(x[4]))
        return h100.model_copy(update={"power": power}), resp, run

    def residuals(x: np.ndarray) -> np.ndarray:
        gpu, resp, run = trial(x)
        return _log_ratio_residuals(sweep, predict_h100nvl(h100_nvl(gpu), sweep, run, resp))

    best = None
    for knee in (0.45, 0.55, 0.65):
        sol = least_squares(
            residuals,
            np.asarray([0.75, knee, 0.5, 20.0, 40.0]),
            bounds=([0.3, 0.3, 0.0, 0.0, 1.0], [1.0, 0.98, 1.0, 200.0, 1000.0]),
        )
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    x = [round(float(v), 4) for v in best.x]
    gpu, resp, run = trial(np.asarray(x))
    run = HostBoundRun(round(host_ms, 2), round(run.gpu_overhead_ms, 2), round(run.window_s, 1))
    return gpu.power, resp, run


def static_power_w(gpu: GpuType) -> float:
    """Static power of a locked-clock GPU above idle at the max clock (W): the Perseus
    blocking power less idle on the A100; other types take the A100's share of TDP."""
    a100_share = (PERSEUS_BLOCKING_W - 63.0) / 400.0
    if gpu.name == "A100-SXM4-80GB":
        return round(PERSEUS_BLOCKING_W - gpu.idle_w, 2)
    return round(a100_share * gpu.tdp_w, 2)


@dataclass(frozen=True)
class Fit:
    """Every fitted constant: the GPU entries, the clock response, the H100 NVL run and
    Splitwise's stack latency per all-reduce of each GPU type."""

    gpus: dict[str, GpuType]
    clock: ClockResponse
    h100nvl: HostBoundRun
    splitwise_stack: dict[str, float]


def fit_all(catalog: Catalog, tables: Tables) -> Fit:
    """Fit A100-SXM4-80GB and H100-SXM5-80GB in order:

    1. ``efficiency``: the all-reduce on Vidur's NCCL table (``fit_allreduce``), then the
       rest and Splitwise's stack latency on Splitwise and Vidur latency (``fit_latency``;
       max clock only);
    2. ``locked_clock_w`` (``static_power_w``), then ``sm_fraction`` and
       ``memory_bound_sm_activity`` on Splitwise prompt and token power (``fit_power``);
    3. the H100's voltage floor and knee and ``ClockResponse.overhead_fixed`` on the
       H100 NVL sweep (``fit_h100nvl``);
    4. the A100's voltage floor and knee and ``ClockResponse.compute_fixed`` on Perseus
       (``fit_perseus``); steps 3 and 4 are repeated once, as each uses the other's
       clock-response constant.
    """
    gpus: dict[str, GpuType] = {}
    stacks: dict[str, float] = {}
    for name, hw in (("A100-SXM4-80GB", "a100-80gb"), ("H100-SXM5-80GB", "h100-80gb")):
        gpu = catalog.gpu(name)
        gpu = gpu.model_copy(update={"efficiency": fit_allreduce(tables, gpu)})
        eff, stacks[name] = fit_latency(catalog, tables, gpu)
        gpu = gpu.model_copy(update={"efficiency": eff})
        power = gpu.power.model_copy(update={"locked_clock_w": static_power_w(gpu)})
        gpu = gpu.model_copy(update={"power": power})
        power = fit_power(catalog, gpu, read_power_constants(tables.power, hw), stacks[name])
        gpus[name] = gpu.model_copy(update={"power": power})
    clock = CLOCK_RESPONSE
    run = H100NVL_RUN
    for _ in range(2):
        h_power, clock, run = fit_h100nvl(tables, gpus["H100-SXM5-80GB"], clock)
        gpus["H100-SXM5-80GB"] = gpus["H100-SXM5-80GB"].model_copy(update={"power": h_power})
        a_power, clock = fit_perseus(tables, gpus["A100-SXM4-80GB"], clock)
        gpus["A100-SXM4-80GB"] = gpus["A100-SXM4-80GB"].model_copy(update={"power": a_power})
    return Fit(gpus, clock, run, stacks)
