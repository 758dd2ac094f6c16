"""Fit a GPU's efficiency and power constants to the measured tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from energyopt.catalog.loader import Catalog
from energyopt.perf.calibration import (
    SPLITWISE_HARDWARE,
    SPLITWISE_MODELS,
    VIDUR_HARDWARE,
    VIDUR_MODELS,
    ErrorStats,
    PowerConstants,
    SplitwiseRows,
    error_stats,
    phase_power_w,
    predict_splitwise,
    predict_vidur_layer_ms,
    read_power_constants,
    read_splitwise,
    read_vidur,
    splitwise_average_power,
)
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


def latency_errors(catalog: Catalog, tables: Tables, gpu: GpuType) -> list[ErrorStats]:
    """Error of the latency model of ``gpu`` on every table that measured it."""
    stats: list[ErrorStats] = []
    for hw, mname, model, rows in splitwise_tables(catalog, tables, gpu):
        pre, dec = predict_splitwise(gpu, model, rows)
        stats.append(error_stats(f"splitwise {hw} {mname} prompt", pre.ms, rows.prompt_ms))
        stats.append(error_stats(f"splitwise {hw} {mname} token", dec.ms, rows.token_ms))
    for gname, cname, path in tables.vidur():
        if gname != gpu.name:
            continue
        rows_v = read_vidur(path)
        pred = predict_vidur_layer_ms(gpu, catalog.model(cname), rows_v)
        stats.append(error_stats(f"vidur {path.parent.name} {path.name}", pred, rows_v.layer_ms))
    return stats


def power_errors(catalog: Catalog, tables: Tables, gpu: GpuType) -> list[ErrorStats]:
    """Error of the power model against Splitwise's constants and average-power rows."""
    stats: list[ErrorStats] = []
    hw = next((k for k, v in SPLITWISE_HARDWARE.items() if v == gpu.name), None)
    if hw is None:
        return stats
    const = read_power_constants(tables.power, hw)
    prompt_w, token_w = phase_power_w(gpu, catalog.model("Llama-2-70B"))
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
        pred = splitwise_average_power(gpu, catalog.model(cname), rows)
        stats.append(
            error_stats(
                f"splitwise {hw} {mname} average power", pred[keep], rows.avg_power_frac[keep]
            )
        )
    return stats


def fit_latency(catalog: Catalog, tables: Tables, gpu: GpuType) -> Efficiency:
    """Least squares on log latency over every table of ``gpu``."""

    def residuals(x: np.ndarray) -> np.ndarray:
        eff = Efficiency(
            compute=float(x[0]),
            memory=float(x[1]),
            step_overhead_ms=float(x[2]),
            allreduce_latency_ms=float(x[3]),
            link=float(x[4]),
        )
        trial = gpu.model_copy(update={"efficiency": eff})
        res: list[np.ndarray] = []
        for _, _, model, rows in splitwise_tables(catalog, tables, gpu):
            pre, dec = predict_splitwise(trial, model, rows)
            res.append(np.log(pre.ms / rows.prompt_ms))
            res.append(np.log(dec.ms / rows.token_ms))
        for gname, cname, path in tables.vidur():
            if gname == gpu.name:
                rows_v = read_vidur(path)
                pred = predict_vidur_layer_ms(trial, catalog.model(cname), rows_v)
                res.append(np.log(pred / rows_v.layer_ms))
        return np.concatenate(res)

    e = gpu.efficiency
    x0 = np.asarray(
        [e.compute, e.memory, max(e.step_overhead_ms, 0.5), e.allreduce_latency_ms, e.link]
    )
    sol = least_squares(
        residuals, x0, bounds=([0.05, 0.05, 0.0, 0.0, 0.01], [1.0, 1.0, 50.0, 5.0, 1.0])
    )
    x = [round(float(v), 4) for v in sol.x]
    return Efficiency(
        compute=x[0], memory=x[1], step_overhead_ms=x[2], allreduce_latency_ms=x[3], link=x[4]
    )


def fit_power(catalog: Catalog, gpu: GpuType, const: PowerConstants) -> PowerParams:
    """SM share of dynamic power and SM activity of memory-bound work, from prompt/token power."""
    model = catalog.model("Llama-2-70B")

    def residuals(x: np.ndarray) -> np.ndarray:
        power = gpu.power.model_copy(
            update={"sm_fraction": float(x[0]), "memory_bound_sm_activity": float(x[1])}
        )
        trial = gpu.model_copy(update={"power": power})
        prompt_w, token_w = phase_power_w(trial, model)
        return np.asarray([prompt_w / const.prompt_w - 1.0, token_w / const.token_w - 1.0])

    sol = least_squares(residuals, np.asarray([0.85, 0.45]), bounds=([0.3, 0.0], [1.0, 1.0]))
    return gpu.power.model_copy(
        update={
            "sm_fraction": round(float(sol.x[0]), 4),
            "memory_bound_sm_activity": round(float(sol.x[1]), 4),
        }
    )


def fit_gpu(catalog: Catalog, tables: Tables, name: str) -> GpuType:
    """``name`` with fitted efficiency and power constants."""
    gpu = catalog.gpu(name)
    gpu = gpu.model_copy(update={"efficiency": fit_latency(catalog, tables, gpu)})
    hw = next((k for k, v in SPLITWISE_HARDWARE.items() if v == name), None)
    if hw is not None:
        gpu = gpu.model_copy(
            update={"power": fit_power(catalog, gpu, read_power_constants(tables.power, hw))}
        )
    return gpu
