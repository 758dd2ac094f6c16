"""Clock dependence of GPU power: voltage curve, dynamic power factor, static power.

Board power of a GPU that is on splits into three parts (docs/performance-model.md, §3):

* idle power ``idle_w`` (clocks free, nothing running), paid whenever the GPU is on;
* static power of a GPU held at a locked clock, ``locked_clock_w`` at the max clock: leakage
  and the clock tree, which follow the supply voltage (``(V/V_max)^2``), not the clock, so
  below the voltage floor they stop falling;
* dynamic power of the work: the SMs draw ``sm_fraction x (TDP - idle - locked)`` at
  full activity and the max clock, scaled by ``f V^2`` and the SM activity; the memory
  system draws ``HBM_PJ_PER_BIT`` per bit moved, whatever the clock. Their sum is capped
  at ``TDP - idle - locked`` (the board's power limit).
"""

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


def static_power_factor(clock_ratio: FloatArray, floor: FloatArray, knee: FloatArray) -> FloatArray:
    """Static (leakage and clock-tree) power at f relative to f_max: (V/V_max)^2."""
    return np.asarray(voltage_ratio(clock_ratio, floor, knee) ** 2)


HBM_PJ_PER_BIT = 3.9
"""Energy to move one bit between HBM and the GPU (pJ): O'Connor et al., "Fine-Grained
DRAM: Energy-Efficient DRAM for Extreme Bandwidth Systems", MICRO 2017 (HBM2: about
3.9 pJ/bit, I/O and DRAM core). Used for HBM2e (A100) and HBM3 (H100, H200) alike, and
for GDDR6 (L4, L40S), whose energy per bit is higher; no table measures it directly."""


def memory_power_w(bytes_moved: FloatArray, ms: FloatArray) -> FloatArray:
    """Power of moving ``bytes_moved`` bytes in ``ms`` milliseconds (W)."""
    return np.asarray(bytes_moved * 8.0 * HBM_PJ_PER_BIT * 1e-12 / (ms / 1e3))


def dynamic_range_w(tdp_w: FloatArray, idle_w: FloatArray, locked_w: FloatArray) -> FloatArray:
    """Dynamic power of full activity at the max clock (W): TDP less idle and static power."""
    return np.asarray(np.maximum(tdp_w - idle_w - locked_w, 0.0))


def gpu_on_power_w(gpu: GpuType, clock_mhz: float) -> float:
    """Power of a GPU that is on, clocks locked at ``clock_mhz``, nothing running (W).

    Idle power plus the static power of the locked clock, which follows the voltage
    curve (``static_power_factor``).
    """
    ratio = np.asarray([clock_mhz / gpu.max_sm_clock_mhz])
    factor = static_power_factor(
        ratio, np.asarray([gpu.power.voltage_floor]), np.asarray([gpu.power.knee_fraction])
    )
    return float(gpu.idle_w + gpu.power.locked_clock_w * factor[0])
