"""Clock dependence of GPU power: voltage curve, dynamic power factor, on-power."""

from __future__ import annotations

import numpy as np

from energyopt.perf.params import FloatArray
from energyopt.spec.hardware import GpuType


def voltage_ratio(clock_ratio: FloatArray, floor: FloatArray, knee: FloatArray) -> FloatArray:
    """V(f)/V(f_max): flat at ``floor`` up to the knee clock, then linear to 1."""
    span = np.maximum(1.0 - knee, 1e-9)
    rise = np.clip((clock_ratio - knee) / span, 0.0, 1.0)
    return np.asarray(floor + (1.0 - floor) * rise)


def clock_power_factor(clock_ratio: FloatArray, floor: FloatArray, knee: FloatArray) -> FloatArray:
    """Dynamic power at f relative to f_max at equal activity: (f/f_max) (V/V_max)^2."""
    return np.asarray(clock_ratio * voltage_ratio(clock_ratio, floor, knee) ** 2)


def gpu_on_power_w(gpu: GpuType, clock_mhz: float) -> float:
    """Power of a GPU that is on, clocks locked at ``clock_mhz``, nothing running (W)."""
    ratio = np.asarray([clock_mhz / gpu.max_sm_clock_mhz])
    factor = clock_power_factor(
        ratio, np.asarray([gpu.power.voltage_floor]), np.asarray([gpu.power.knee_fraction])
    )
    return float(gpu.idle_w + gpu.power.locked_clock_w * factor[0])
