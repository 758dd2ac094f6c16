"""GPU check: lock several SM clocks in turn under a small load, measure, restore, compare.

Run on a host with an NVIDIA GPU, nvidia-ml-py and root (or CAP_SYS_ADMIN)::

    python -m energyopt.nvml.gpucheck --gpu 0 --clocks 4 --seconds 10

For each clock it locks the SM clock (through the executor's transaction, so the
original setting is checkpointed and restored even on Ctrl-C), runs a bf16 matmul
loop (PyTorch, else CuPy; else idle), measures energy from the NVML counter and
prints the measured average power next to the model's prediction: the on-power
``perf.power.gpu_on_power_w`` plus the dynamic power
``sm_fraction * (TDP - idle) * clock_power_factor`` at full SM activity (capped
by the power limit). Without a GPU or pynvml it exits with status 2 and a message.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.catalog import builtin_catalog
from energyopt.nvml.actions import Ctx, LockClocks
from energyopt.nvml.errors import ExecutorError
from energyopt.nvml.measure import measure
from energyopt.nvml.mps import SubprocessMps
from energyopt.nvml.names import name_matches
from energyopt.nvml.transaction import Transaction, restore
from energyopt.perf.power import clock_power_factor, gpu_on_power_w
from energyopt.spec.hardware import GpuType


def predicted_power_w(gpu: GpuType, clock_mhz: float, activity: float, limit_w: float) -> float:
    """Model power (W) at ``clock_mhz``, SM activity ``activity`` (0..1), capped by the limit."""
    factor = clock_power_factor(
        np.asarray([clock_mhz / gpu.max_sm_clock_mhz]),
        np.asarray([gpu.power.voltage_floor]),
        np.asarray([gpu.power.knee_fraction]),
    )[0]
    dynamic = activity * gpu.power.sm_fraction * (gpu.tdp_w - gpu.idle_w) * float(factor)
    return min(gpu_on_power_w(gpu, clock_mhz) + dynamic, limit_w)


def pick_clocks(supported: Sequence[int], count: int, low_fraction: float = 0.4) -> list[int]:
    """``count`` supported clocks spread from ``low_fraction`` of the max to the max (MHz)."""
    top = max(supported)
    usable = sorted(c for c in supported if c >= low_fraction * top)
    if count <= 1 or len(usable) <= count:
        return usable[-count:] if count >= 1 else []
    picks = {usable[round(i * (len(usable) - 1) / (count - 1))] for i in range(count)}
    return sorted(picks)


def _load(index: int) -> tuple[Callable[[threading.Event], None] | None, str]:
    """A function that keeps GPU ``index`` busy until the event is set, and its name."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA index = NVML index
    try:
        torch: Any = importlib.import_module("torch")
        if torch.cuda.is_available():

            def run_torch(stop: threading.Event) -> None:
                dev = torch.device(f"cuda:{index}")
                a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
                while not stop.is_set():
                    for _ in range(20):
                        a = (a @ a).clamp_(-1, 1)
                    torch.cuda.synchronize(dev)

            return run_torch, "torch bf16 matmul 4096^3"
    except ImportError:
        pass
    try:
        cp: Any = importlib.import_module("cupy")

        def run_cupy(stop: threading.Event) -> None:
            with cp.cuda.Device(index):
                a = cp.random.rand(4096, 4096, dtype=cp.float32)
                while not stop.is_set():
                    for _ in range(10):
                        a = cp.clip(a @ a, -1, 1)
                    cp.cuda.Device(index).synchronize()

        return run_cupy, "cupy fp32 matmul 4096^3"
    except ImportError:
        return None, "none (install torch or cupy for a load); idle power only"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; 0 when it ran, 2 when there is no GPU/pynvml, 1 on an executor error."""
    ap = argparse.ArgumentParser(prog="nvml_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="NVML index")
    ap.add_argument("--clocks", type=int, default=4, help="how many SM clocks to test")
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window per clock")
    ap.add_argument("--warmup", type=float, default=3.0, help="load before measuring (s)")
    args = ap.parse_args(argv)
    try:
        from energyopt.nvml.real import NvmlBackend

        nvml = NvmlBackend()
        nvml.open()
    except ExecutorError as exc:
        print(f"nvml_check: cannot run here: {exc}", file=sys.stderr)
        return 2
    try:
        return _check(nvml, args)
    except ExecutorError as exc:
        print(f"nvml_check: {exc}", file=sys.stderr)
        return 1
    finally:
        nvml.close()


def _check(nvml: Any, args: argparse.Namespace) -> int:
    from energyopt.nvml.session import RealClock

    i = args.gpu
    name, uuid = nvml.name(i), nvml.uuid(i)
    gpu = next((g for g in builtin_catalog().gpus.values() if name_matches(g.name, name)), None)
    if gpu is None:
        print(f"nvml_check: {name} is not in the catalog; nothing to compare with", file=sys.stderr)
        return 2
    ctx = Ctx(nvml, SubprocessMps())
    clocks = pick_clocks(nvml.supported_sm_clocks(i), args.clocks)
    limit_w = nvml.get_power_limit(i) / 1000
    work, load_name = _load(i)
    activity = 1.0 if work is not None else 0.0
    print(f"GPU {i} {name} ({uuid}) as {gpu.name}; load: {load_name}; limit {limit_w:g} W")
    print("clock MHz  mean SM MHz  measured W  predicted W  error %")
    with tempfile.TemporaryDirectory() as tmp:
        for n, clock in enumerate(clocks):
            cp = Path(tmp) / f"cp{n}.json"
            Transaction(ctx, [LockClocks(name, i, uuid, clock_mhz=clock)], cp).run()
            stop = threading.Event()
            thread = threading.Thread(target=work, args=(stop,), daemon=True) if work else None
            try:
                if thread:
                    thread.start()
                    RealClock().sleep(args.warmup)
                windows, _ = measure(nvml, RealClock(), seconds=args.seconds, interval_s=0.2)
            finally:
                stop.set()
                if thread:
                    thread.join()
                if cp.exists():
                    _, errors = restore(ctx, cp)
                    for line in errors:
                        print(f"nvml_check: RESTORE FAILED: {line}", file=sys.stderr)
            w = windows[i]
            pred = predicted_power_w(gpu, w.mean_sm_clock_mhz, activity, limit_w)
            err = 100 * (w.avg_power_w - pred) / pred
            print(
                f"{clock:9d}  {w.mean_sm_clock_mhz:11.0f}  {w.avg_power_w:10.1f}  "
                f"{pred:11.1f}  {err:+7.1f}"
            )
    print("clocks restored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
