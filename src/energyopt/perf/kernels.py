"""Time and power of generic GPU kernels (FLOPs + bytes) at given SM clocks.

The roofline and power model is ``perf.forward.kernel_pass`` (the one forward
passes use): compute time scales with 1/f, memory time does not, dynamic power
follows f V(f)^2 and the SM activity. Only the hardware fields of ``OpParams``
are filled; the LLM fields are unused by a kernel.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from energyopt.perf.clocks import spread_clocks_mhz
from energyopt.perf.forward import kernel_pass
from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.hardware import GpuType


def kernel_params(
    gpu: GpuType, clock_mhz: FloatArray, compute_efficiency: FloatArray, launch_ms: FloatArray
) -> OpParams:
    """Whole-GPU operating points of ``gpu`` at ``clock_mhz`` (one entry per kernel).

    ``compute_efficiency`` scales the GPU's achieved tensor rate (a kernel that
    reaches half of a GEMM's rate has 0.5); ``launch_ms`` is the kernel's fixed
    cost at the maximum clock (ms).
    """
    n = int(np.asarray(clock_mhz).shape[0])
    values: dict[str, Any] = {}
    for f in fields(OpParams):
        if f.name == "profile":
            values[f.name] = np.full(n, None, dtype=object)
        elif f.name == "has_profile":
            values[f.name] = np.zeros(n, dtype=bool)
        elif f.name == "phase":
            values[f.name] = np.zeros(n, dtype=np.int64)
        else:
            values[f.name] = np.zeros(n, dtype=np.float64)

    def full(value: float) -> FloatArray:
        return np.full(n, value, dtype=np.float64)

    values.update(
        peak_flops=full(gpu.peak_bf16_tflops * 1e12),
        peak_bw=full(gpu.memory_bandwidth_gbps * 1e9),
        eff_compute=gpu.efficiency.compute * np.asarray(compute_efficiency, dtype=np.float64),
        eff_memory=full(gpu.efficiency.memory),
        overhead_ms=np.asarray(launch_ms, dtype=np.float64),
        clock_ratio=np.asarray(clock_mhz, dtype=np.float64) / gpu.max_sm_clock_mhz,
        sm_fraction=full(1.0),
        bw_fraction=full(1.0),
        memory_bytes=full(gpu.memory_gb * 1e9),
        tp=full(1.0),
        link_bw=full(1.0),
        tdp_w=full(gpu.tdp_w),
        idle_w=full(gpu.idle_w),
        sm_power_fraction=full(gpu.power.sm_fraction),
        mem_bound_activity=full(gpu.power.memory_bound_sm_activity),
        voltage_floor=full(gpu.power.voltage_floor),
        knee_fraction=full(gpu.power.knee_fraction),
        locked_clock_w=full(gpu.power.locked_clock_w),
        compute_clock_fixed=full(gpu.efficiency.compute_clock_fixed),
        overhead_clock_fixed=full(gpu.efficiency.overhead_clock_fixed),
        profile_clock_ratio=full(1.0),
    )
    return OpParams(**values)


def kernel_costs(
    gpu: GpuType,
    clock_mhz: FloatArray,
    flops: FloatArray,
    total_bytes: FloatArray,
    compute_efficiency: FloatArray,
    launch_ms: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(time_ms, active_w) of each kernel on ``gpu`` at its clock.

    ``active_w`` is the board power while the kernel runs: the on-power of the
    GPU at that clock (``perf.power.gpu_on_power_w``) plus the kernel's dynamic
    power.
    """
    clocks = np.asarray(clock_mhz, dtype=np.float64)
    p = kernel_params(gpu, clocks, compute_efficiency, launch_ms)
    out = kernel_pass(p, np.asarray(flops, dtype=np.float64), np.asarray(total_bytes))
    on = {c: gpu_on_power_w(gpu, c) for c in np.unique(clocks).tolist()}
    on_w = np.asarray([on[c] for c in clocks.tolist()], dtype=np.float64)
    return np.asarray(out.ms, dtype=np.float64), np.asarray(out.power_w + on_w)


def default_clocks_mhz(gpu: GpuType, levels: int) -> tuple[int, ...]:
    """``levels`` supported clocks from 40% of the maximum clock up to the maximum (MHz).

    40% lies below the power model's voltage knee, so memory-bound kernels can
    use the low clocks and compute-bound ones the clocks around the knee.
    """
    return spread_clocks_mhz(gpu, levels, 0.4 * gpu.max_sm_clock_mhz)
