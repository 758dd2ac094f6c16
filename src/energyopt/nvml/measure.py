"""Status and energy measurement per GPU from the NVML counters.

Energy comes from nvmlDeviceGetTotalEnergyConsumption (mJ) at the start and end
of the window; average power is that energy over the window. Power and SM clock
are also sampled every ``interval_s`` for their means.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from energyopt.nvml.backend import Backend, Clock
from energyopt.nvml.errors import ExecutorError


@dataclass(frozen=True)
class GpuStatus:
    """Readings of one GPU. Power in W, clocks in MHz, energy in J."""

    index: int
    uuid: str
    name: str
    persistence: bool
    sm_clock_mhz: int
    locked: str
    power_w: float
    power_limit_w: float
    limit_min_w: float
    limit_max_w: float
    energy_j: float
    mig: str


def gpu_status(backend: Backend, index: int) -> GpuStatus:
    """Current readings of GPU ``index``."""
    lo, hi = backend.get_power_limit_constraints(index)
    locked = backend.get_locked_clocks(index)
    if locked is None:
        locked_s = "unlocked"
    elif locked == "unknown":
        locked_s = "n/a"
    else:
        locked_s = f"{locked[0]}-{locked[1]} MHz" if locked[0] != locked[1] else f"{locked[0]} MHz"
    if backend.mig_supported(index):
        current, pending = backend.get_mig_mode(index), backend.get_mig_pending(index)
        placed = backend.list_gpu_instances(index) if current else ()
        mig = "on: " + (", ".join(f"{n}@{s}" for n, s in placed) or "no instances")
        mig = mig if current else "off"
        if pending != current:
            mig += (
                f" ({'enable' if pending else 'disable'} pending: takes effect after a GPU "
                f"reset, `nvidia-smi -r -i {index}`)"
            )
    else:
        mig = "n/a"
    return GpuStatus(
        index=index,
        uuid=backend.uuid(index),
        name=backend.name(index),
        persistence=backend.get_persistence(index),
        sm_clock_mhz=backend.get_sm_clock(index),
        locked=locked_s,
        power_w=backend.get_power_usage(index) / 1000,
        power_limit_w=backend.get_power_limit(index) / 1000,
        limit_min_w=lo / 1000,
        limit_max_w=hi / 1000,
        energy_j=backend.get_total_energy(index) / 1000,
        mig=mig,
    )


def format_status(rows: list[GpuStatus]) -> list[str]:
    """A table of ``gpu_status`` rows."""
    out = []
    for r in rows:
        out.append(f"GPU {r.index}  {r.name}  {r.uuid}")
        out.append(
            f"  SM clock {r.sm_clock_mhz} MHz (locked: {r.locked}), power {r.power_w:.1f} W, "
            f"limit {r.power_limit_w:g} W [{r.limit_min_w:g}, {r.limit_max_w:g}], "
            f"energy counter {r.energy_j:,.1f} J, persistence {'on' if r.persistence else 'off'}"
            f", MIG {r.mig}"
        )
    return out


@dataclass(frozen=True)
class GpuWindow:
    """One GPU over a measurement window. Energy in J, power in W, clocks in MHz."""

    index: int
    name: str
    seconds: float
    energy_j: float
    avg_power_w: float
    mean_sampled_power_w: float
    mean_sm_clock_mhz: float
    min_sm_clock_mhz: int
    max_sm_clock_mhz: int


@dataclass
class _Acc:
    power_mw: float = 0.0
    clock_sum: float = 0.0
    clock_min: int = 1 << 30
    clock_max: int = 0
    n: int = 0


def _sample(backend: Backend, indices: list[int], accs: list[_Acc]) -> None:
    for i, acc in zip(indices, accs, strict=True):
        clock = backend.get_sm_clock(i)
        acc.power_mw += backend.get_power_usage(i)
        acc.clock_sum += clock
        acc.clock_min = min(acc.clock_min, clock)
        acc.clock_max = max(acc.clock_max, clock)
        acc.n += 1


def measure(
    backend: Backend,
    clock: Clock,
    seconds: float | None = None,
    command: Sequence[str] | None = None,
    interval_s: float = 0.1,
) -> tuple[list[GpuWindow], int]:
    """Measure every GPU for ``seconds`` or while ``command`` runs.

    Returns the windows and the command's exit status (0 without a command).
    """
    if (seconds is None) == (not command):
        raise ExecutorError("measure needs either --seconds N or -- COMMAND")
    if seconds is not None and seconds <= 0:
        raise ExecutorError("--seconds must be positive")
    indices = list(range(backend.device_count()))
    accs = [_Acc() for _ in indices]
    e0 = [backend.get_total_energy(i) for i in indices]
    t0 = clock.now()
    _sample(backend, indices, accs)
    rc = 0
    if command:
        try:
            proc = subprocess.Popen(list(command))
        except OSError as exc:
            raise ExecutorError(f"cannot run {command[0]!r}: {exc}") from None
        while proc.poll() is None:
            clock.sleep(interval_s)
            _sample(backend, indices, accs)
        rc = int(proc.returncode)
    else:
        assert seconds is not None
        while (left := seconds - (clock.now() - t0)) > 1e-9:
            clock.sleep(min(interval_s, left))
            _sample(backend, indices, accs)
    elapsed = max(clock.now() - t0, 1e-9)
    out = []
    for i, acc, start in zip(indices, accs, e0, strict=True):
        energy_j = (backend.get_total_energy(i) - start) / 1000
        out.append(
            GpuWindow(
                index=i,
                name=backend.name(i),
                seconds=elapsed,
                energy_j=energy_j,
                avg_power_w=energy_j / elapsed,
                mean_sampled_power_w=acc.power_mw / acc.n / 1000,
                mean_sm_clock_mhz=acc.clock_sum / acc.n,
                min_sm_clock_mhz=acc.clock_min,
                max_sm_clock_mhz=acc.clock_max,
            )
        )
    return out, rc


def format_windows(windows: list[GpuWindow]) -> list[str]:
    """A table of measurement windows, with the total."""
    out = []
    for w in windows:
        out.append(
            f"GPU {w.index}  {w.name}: {w.energy_j:,.1f} J in {w.seconds:.2f} s, average "
            f"{w.avg_power_w:.1f} W (sampled {w.mean_sampled_power_w:.1f} W), SM clock mean "
            f"{w.mean_sm_clock_mhz:.0f} MHz [{w.min_sm_clock_mhz}, {w.max_sm_clock_mhz}]"
        )
    total = sum(w.energy_j for w in windows)
    out.append(f"total {total:,.1f} J over {len(windows)} GPU(s)")
    return out
