"""Clock sweep of one GPU: the measurements ``energyopt calibrate`` fits.

For each SM clock of the sweep (highest first) the GPU's clock is locked, each
fixed kernel runs ``repeats`` times, and every run's wall time and its NVML energy
counter difference become one row of the CSV (perf/clockfit.py reads it):

    kernel,clock_mhz,flops,bytes,seconds,energy_j

The kernels are a bf16 matmul (compute-bound) and a device-to-device copy
(memory-bound), sized to run about ``seconds`` each at the highest clock. The locked
clocks the GPU had before are restored at the end, on an error and on Ctrl-C.

Runners: ``TorchRunner`` (PyTorch with CUDA) on a real GPU; ``SimRunner`` on the
simulated NVML (``ENERGYOPT_NVML_BACKEND=sim``), where a run lasts the performance
model's time for the kernel at the locked clock and the simulated energy counter
advances with it.
"""

from __future__ import annotations

import csv
import importlib
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from energyopt.nvml.backend import Backend, LockedClocks
from energyopt.nvml.sim import SimulatedNvml
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import write_text_atomic

COLUMNS = ("kernel", "clock_mhz", "flops", "bytes", "seconds", "energy_j")
MATMUL_N = 8192
"""Side of the square bf16 matmul (2 N^3 FLOPs a product)."""
COPY_BYTES = 2 * 1024**3
"""Bytes of the copied buffer (read once and written once per copy)."""


@dataclass(frozen=True)
class Kernel:
    """A fixed workload: ``repeat`` launches of one operation (whole-run FLOPs and bytes)."""

    name: str
    flops: float
    bytes: float
    repeat: int


@dataclass(frozen=True)
class Row:
    """One timed run."""

    kernel: str
    clock_mhz: int
    flops: float
    bytes: float
    seconds: float
    energy_j: float


class Runner(Protocol):
    """Runs a kernel on the GPU, blocking until it has finished."""

    def run(self, kernel: Kernel) -> float:
        """Run ``kernel``; its wall time (s)."""
        ...


def kernels_for(gpu: GpuType, seconds: float) -> list[Kernel]:
    """The matmul and the copy, repeated to last about ``seconds`` each on ``gpu`` at its
    max clock (from its datasheet peaks)."""
    product = 2.0 * MATMUL_N**3
    matmul_s = product / (gpu.peak_bf16_tflops * 1e12 * 0.7)
    copy = 2.0 * COPY_BYTES
    copy_s = copy / (gpu.memory_bandwidth_gbps * 1e9 * 0.8)
    n_mm = max(1, round(seconds / matmul_s))
    n_cp = max(1, round(seconds / copy_s))
    return [
        Kernel("matmul", product * n_mm, 3.0 * 2 * MATMUL_N**2 * n_mm, n_mm),
        Kernel("memory", 0.0, copy * n_cp, n_cp),
    ]


def sweep_clocks(
    supported: tuple[int, ...], count: int, lowest_fraction: float = 0.45
) -> list[int]:
    """``count`` supported clocks evenly spread from the highest down to
    ``lowest_fraction`` of it (MHz, descending, no repeats)."""
    top = max(supported)
    floor = max(min(supported), lowest_fraction * top)
    pool = np.asarray(sorted(c for c in supported if c >= floor), dtype=np.float64)
    targets = np.linspace(top, floor, max(count, 2))
    picked = {int(pool[np.argmin(np.abs(pool - t))]) for t in targets}
    return sorted(picked, reverse=True)


def _restore(backend: Backend, index: int, before: LockedClocks) -> None:
    if isinstance(before, tuple):
        backend.set_locked_clocks(index, before[0], before[1])
    else:
        backend.reset_locked_clocks(index)


def run_sweep(
    backend: Backend,
    index: int,
    runner: Runner,
    kernels: list[Kernel],
    clocks_mhz: list[int],
    repeats: int = 1,
    say: Any = None,
) -> list[Row]:
    """Lock each clock in turn, run every kernel ``repeats`` times, read the energy
    counter around each run; restore the locked clocks found at the start."""
    before = backend.get_locked_clocks(index)
    rows: list[Row] = []
    try:
        for clock in clocks_mhz:
            backend.set_locked_clocks(index, clock, clock)
            for kernel in kernels:
                for _ in range(repeats):
                    e0 = backend.get_total_energy(index)
                    seconds = runner.run(kernel)
                    e1 = backend.get_total_energy(index)
                    row = Row(
                        kernel.name, clock, kernel.flops, kernel.bytes, seconds, (e1 - e0) / 1e3
                    )
                    rows.append(row)
                    if say is not None:
                        say(f"{clock} MHz {kernel.name}: {seconds:.3f} s, {row.energy_j:.1f} J")
    finally:
        _restore(backend, index, before)
    return rows


def csv_text(rows: list[Row]) -> str:
    """The rows as the CSV ``energyopt calibrate`` reads."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow(
            [
                r.kernel,
                r.clock_mhz,
                f"{r.flops:.6g}",
                f"{r.bytes:.6g}",
                f"{r.seconds:.6f}",
                f"{r.energy_j:.4f}",
            ]
        )
    return out.getvalue()


def write_csv(rows: list[Row], path: str | Path) -> None:
    """Write the rows (atomically)."""
    write_text_atomic(path, csv_text(rows))


class SimRunner:
    """A kernel on the simulated NVML: it lasts the performance model's time at the
    locked clock, at full SM activity (matmul) or the type's memory-bound activity."""

    def __init__(self, sim: SimulatedNvml, index: int) -> None:
        self.sim = sim
        self.index = index

    def run(self, kernel: Kernel) -> float:
        """Advance simulated time by the kernel's modelled duration (s)."""
        from energyopt.perf.calibration import clock_params
        from energyopt.perf.forward import kernel_pass
        from energyopt.perf.power import memory_power_w

        gpu = self.sim.gpu_type(self.index)
        clock = self.sim.get_sm_clock(self.index)
        p = clock_params(gpu, np.asarray([float(clock)]), 0.0)
        out = kernel_pass(p, np.asarray([kernel.flops]), np.asarray([kernel.bytes]))
        seconds = float(out.ms[0]) / 1e3
        activity = 1.0 if kernel.flops > 0 else gpu.power.memory_bound_sm_activity
        memory_w = float(memory_power_w(np.asarray([kernel.bytes]), out.ms)[0])
        self.sim.set_load(self.index, activity, memory_w)
        self.sim.advance(seconds)
        self.sim.set_load(self.index, 0.0)
        return seconds


class TorchRunner:
    """The kernels with PyTorch on CUDA device ``index`` (NVML order)."""

    def __init__(self, index: int) -> None:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        torch: Any = importlib.import_module("torch")
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        self.torch = torch
        self.dev = torch.device(f"cuda:{index}")
        self.a = torch.randn(MATMUL_N, MATMUL_N, device=self.dev, dtype=torch.bfloat16)
        self.b = torch.randn(MATMUL_N, MATMUL_N, device=self.dev, dtype=torch.bfloat16)
        self.src = torch.empty(COPY_BYTES, device=self.dev, dtype=torch.uint8)
        self.dst = torch.empty_like(self.src)

    def run(self, kernel: Kernel) -> float:
        """Launch the kernel ``repeat`` times and synchronize (s)."""
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        start = time.perf_counter()
        for _ in range(kernel.repeat):
            if kernel.name == "matmul":
                torch.matmul(self.a, self.b)
            else:
                self.dst.copy_(self.src)
        torch.cuda.synchronize(self.dev)
        return time.perf_counter() - start
