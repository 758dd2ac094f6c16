"""A simulated NVML with the real constraints of each catalog GPU type, for tests.

It enforces the supported clock list, the power-limit range, MIG support, MIG
placements (memory slices at NVIDIA's allowed start positions) and per-profile
instance limits, and can refuse writes (no permission),
fail at the k-th write (fault injection) or silently drop a kind of write (to test
read-back). The energy counter advances with simulated time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from energyopt.catalog import mig
from energyopt.nvml.backend import LockedClocks
from energyopt.nvml.errors import (
    ClockNotSupported,
    DeviceMapError,
    MigLayoutError,
    MpsError,
    NoPermission,
    NotSupported,
    PowerLimitOutOfRange,
)
from energyopt.nvml.names import nvml_name
from energyopt.perf.power import clock_power_factor, dynamic_range_w, gpu_on_power_w
from energyopt.spec.base import Spec
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import parse, read_data, write_text_atomic


@dataclass
class SimDevice:
    """Settable state of one simulated GPU (plus its energy counter and load)."""

    type_name: str
    uuid: str
    persistence: bool = False
    locked: tuple[int, int] | None = None
    power_limit_mw: int = 0
    mig_mode: bool = False
    mig_pending: bool | None = None
    instances: list[tuple[str, int]] = field(default_factory=list)
    energy_mj: float = 0.0
    load: float = 0.0
    memory_w: float = 0.0


_Profile = Annotated[str, Field(min_length=1)]
_Slice = Annotated[int, Field(ge=0)]


class SimDeviceState(Spec):
    """One GPU in a saved simulated host (``SimDevice``)."""

    type_name: str = Field(min_length=1)
    uuid: str = Field(min_length=1)
    persistence: bool = False
    locked: tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]] | None = None
    power_limit_mw: int = Field(ge=0)
    mig_mode: bool = False
    mig_pending: bool | None = None
    instances: tuple[tuple[_Profile, _Slice], ...] = ()
    energy_mj: float = Field(default=0.0, ge=0)
    load: float = Field(default=0.0, ge=0, le=1)
    memory_w: float = Field(default=0.0, ge=0)


class SimMpsState(Spec):
    """One MPS daemon in a saved simulated host (``SimMpsDaemon``)."""

    device_uuid: str = Field(min_length=1)
    log_dir: str = Field(min_length=1)
    default_pct: int = Field(default=100, ge=0, le=100)


class SimState(Spec):
    """A saved simulated host: what ``SimulatedNvml.to_json`` writes."""

    types: tuple[Annotated[str, Field(min_length=1)], ...] = Field(min_length=1)
    devices: tuple[SimDeviceState, ...]
    time_s: float = Field(default=0.0, ge=0)
    privileged: bool = True
    mps: dict[str, SimMpsState] = Field(default_factory=dict)


@dataclass
class SimMpsDaemon:
    """A fake MPS control daemon."""

    device_uuid: str
    log_dir: str
    default_pct: int = 100


class SimulatedNvml:
    """In-memory NVML. ``writes`` logs every write call, in order."""

    kind = "sim"

    def __init__(self, gpus: list[GpuType], privileged: bool = True) -> None:
        self.types = list(gpus)
        self.devices = [
            SimDevice(
                type_name=g.name,
                uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
                power_limit_mw=round(_default_limit_w(g) * 1000),
            )
            for i, g in enumerate(gpus)
        ]
        self.privileged = privileged
        self.time_s = 0.0
        self.writes: list[str] = []
        self.mps_daemons: dict[str, SimMpsDaemon] = {}
        self.ignored_ops: set[str] = set()
        self._faults: dict[int, BaseException] = {}

    # fault injection -------------------------------------------------------
    def fail_at_write(self, k: int, error: BaseException) -> None:
        """Make the ``k``-th write from now (0-based) raise ``error`` instead of writing."""
        self._faults[len(self.writes) + k] = error

    def ignore(self, op: str) -> None:
        """Accept writes of ``op`` (a method name) without changing anything."""
        self.ignored_ops.add(op)

    def _write(self, op: str, index: int) -> bool:
        """Account for a write; True when it should take effect."""
        n = len(self.writes)
        self.writes.append(f"{op}[{index}]")
        fault = self._faults.pop(n, None)
        if fault is not None:
            raise fault
        if not self.privileged:
            raise NoPermission(self._label(index), op.removeprefix("set_").replace("_", " "))
        return op not in self.ignored_ops

    def _label(self, index: int) -> str:
        return f"GPU {index} ({self.name(index)}, {self.devices[index].uuid})"

    def _dev(self, index: int) -> SimDevice:
        if not 0 <= index < len(self.devices):
            raise DeviceMapError(f"no GPU with index {index} (this host has {len(self.devices)})")
        return self.devices[index]

    # state -----------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Every settable value of every GPU and MPS daemon (not energy or time)."""
        out: list[dict[str, Any]] = []
        for d in self.devices:
            row = asdict(d)
            row.pop("energy_mj")
            row.pop("load")
            row.pop("memory_w")
            row["instances"] = sorted((str(n), int(st)) for n, st in d.instances)
            out.append(row)
        out.append({"mps": {k: asdict(v) for k, v in sorted(self.mps_daemons.items())}})
        return out

    def to_json(self) -> dict[str, Any]:
        """State for ``from_json`` (the CLI keeps a simulated host between runs)."""
        return {
            "types": [g.name for g in self.types],
            "devices": [asdict(d) for d in self.devices],
            "time_s": self.time_s,
            "privileged": self.privileged,
            "mps": {k: asdict(v) for k, v in self.mps_daemons.items()},
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], catalog: Mapping[str, GpuType], source: str = "state"
    ) -> SimulatedNvml:
        """Rebuild a simulated host saved by ``to_json``; SpecError naming ``source``
        and the field when ``data`` is not such a state."""
        state = parse(SimState, data, source)
        problems: list[str] = []
        for i, name in enumerate(state.types):
            if name not in catalog:
                problems.append(f"{source}: types[{i}]: unknown GPU type {name!r}")
        if len(state.devices) != len(state.types):
            problems.append(
                f"{source}: devices: {len(state.devices)} device(s) for "
                f"{len(state.types)} GPU type(s) in types"
            )
        for i, (dev, name) in enumerate(zip(state.devices, state.types, strict=False)):
            where = f"{source}: devices[{i}]"
            if dev.type_name != name:
                problems.append(f"{where}.type_name: {dev.type_name!r}, but types[{i}] is {name!r}")
            gtype = catalog.get(name)
            if gtype is None:
                continue
            low, high = _limit_range_mw(gtype)
            if not low <= dev.power_limit_mw <= high:
                problems.append(
                    f"{where}.power_limit_mw: {dev.power_limit_mw} is outside {gtype.name}'s "
                    f"range {low}..{high} mW"
                )
            if dev.locked is not None and not (
                gtype.min_sm_clock_mhz <= dev.locked[0] <= dev.locked[1] <= gtype.max_sm_clock_mhz
            ):
                problems.append(
                    f"{where}.locked: {list(dev.locked)} is not a clock range within "
                    f"{gtype.min_sm_clock_mhz}..{gtype.max_sm_clock_mhz} MHz"
                )
        if problems:
            raise SpecError(problems)
        sim = cls([catalog[name] for name in state.types], state.privileged)
        for device, row in zip(sim.devices, state.devices, strict=True):
            for key, value in row.model_dump().items():
                setattr(device, key, value)
            device.locked = row.locked
            device.instances = list(row.instances)
        sim.time_s = state.time_s
        sim.mps_daemons = {k: SimMpsDaemon(**v.model_dump()) for k, v in state.mps.items()}
        return sim

    @classmethod
    def load(cls, path: str | Path, catalog: Mapping[str, GpuType]) -> SimulatedNvml:
        """A simulated host saved with ``save``; SpecError naming the file and the field
        (the file readers' checks: a FIFO, garbage or a too deeply nested file is refused)."""
        return cls.from_json(read_data(path, "json"), catalog, str(path))

    def save(self, path: str | Path) -> None:
        """Write the state as JSON, atomically (its folder is made if missing)."""
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError([f"{p}: cannot write: {exc.strerror or exc}"]) from None
        write_text_atomic(p, json.dumps(self.to_json(), indent=1) + "\n")

    # simulated time and power ----------------------------------------------
    def set_load(self, index: int, load: float, memory_w: float = 0.0) -> None:
        """The work running on GPU ``index``: its SM activity (0..1) and the power of
        the bytes it moves through memory (W, ``perf.power.memory_power_w``)."""
        dev = self._dev(index)
        dev.load = min(max(load, 0.0), 1.0)
        dev.memory_w = max(memory_w, 0.0)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass; energy counters advance."""
        for i, d in enumerate(self.devices):
            d.energy_mj += self.get_power_usage(i) * seconds
        self.time_s += seconds

    # Backend ---------------------------------------------------------------
    def device_count(self) -> int:
        return len(self.devices)

    def index_of_uuid(self, uuid: str) -> int:
        for i, d in enumerate(self.devices):
            if d.uuid == uuid:
                return i
        raise DeviceMapError(f"no GPU with UUID {uuid} on this host (see `energyopt status`)")

    def name(self, index: int) -> str:
        return nvml_name(self._dev(index).type_name)

    def uuid(self, index: int) -> str:
        return self._dev(index).uuid

    def gpu_type(self, index: int) -> GpuType:
        """Catalog type of the simulated GPU."""
        self._dev(index)
        return self.types[index]

    def get_persistence(self, index: int) -> bool:
        return self._dev(index).persistence

    def set_persistence(self, index: int, enabled: bool) -> None:
        dev = self._dev(index)
        if self._write("set_persistence", index):
            dev.persistence = enabled

    def supported_sm_clocks(self, index: int) -> tuple[int, ...]:
        return self.gpu_type(index).sm_clocks_mhz()

    def get_locked_clocks(self, index: int) -> LockedClocks:
        return self._dev(index).locked

    def set_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        dev = self._dev(index)
        clocks = self.supported_sm_clocks(index)
        for c in (min_mhz, max_mhz):
            if c not in clocks:
                near = self.gpu_type(index).nearest_clocks_mhz(c)
                raise ClockNotSupported(self._label(index), c, near)
        if self._write("set_locked_clocks", index):
            dev.locked = (min_mhz, max_mhz)

    def reset_locked_clocks(self, index: int) -> None:
        dev = self._dev(index)
        if self._write("reset_locked_clocks", index):
            dev.locked = None

    def get_power_limit(self, index: int) -> int:
        return self._dev(index).power_limit_mw

    def get_power_limit_constraints(self, index: int) -> tuple[int, int]:
        return _limit_range_mw(self.gpu_type(index))

    def set_power_limit(self, index: int, limit_mw: int) -> None:
        dev = self._dev(index)
        lo, hi = self.get_power_limit_constraints(index)
        if not lo <= limit_mw <= hi:
            raise PowerLimitOutOfRange(self._label(index), limit_mw, lo, hi)
        if self._write("set_power_limit", index):
            dev.power_limit_mw = limit_mw

    def get_sm_clock(self, index: int) -> int:
        dev = self._dev(index)
        g = self.gpu_type(index)
        if dev.locked is not None:
            return dev.locked[1]
        return g.default_sm_clock_mhz if dev.load > 0 else g.min_sm_clock_mhz

    def get_power_usage(self, index: int) -> int:
        """Board power (mW) by the calibrated model (``perf.power``, as a forward pass
        draws it): on-power at the clock (idle plus static power following V^2), plus
        the SM activity's share of the dynamic range at f V^2 and the memory power,
        their sum within the dynamic range, all within the power limit."""
        dev = self._dev(index)
        g = self.gpu_type(index)
        clock = self.get_sm_clock(index)
        factor = clock_power_factor(
            np.asarray([clock / g.max_sm_clock_mhz]),
            np.asarray([g.power.voltage_floor]),
            np.asarray([g.power.knee_fraction]),
        )[0]
        span = float(
            dynamic_range_w(
                np.asarray(g.tdp_w), np.asarray(g.idle_w), np.asarray(g.power.locked_clock_w)
            )
        )
        sm_w = dev.load * g.power.sm_fraction * span * float(factor)
        dynamic = min(sm_w + dev.memory_w, span) if dev.load > 0 or dev.memory_w > 0 else 0.0
        watts = min(gpu_on_power_w(g, clock) + dynamic, dev.power_limit_mw / 1000)
        return round(watts * 1000)

    def get_total_energy(self, index: int) -> int:
        return int(self._dev(index).energy_mj)

    def mig_supported(self, index: int) -> bool:
        return bool(self.gpu_type(index).mig_profiles)

    def get_mig_mode(self, index: int) -> bool:
        return self._dev(index).mig_mode

    def get_mig_pending(self, index: int) -> bool:
        dev = self._dev(index)
        return dev.mig_mode if dev.mig_pending is None else dev.mig_pending

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        dev = self._dev(index)
        if not self.mig_supported(index):
            raise NotSupported(self._label(index), "MIG mode")
        if not enabled and dev.instances:
            raise MigLayoutError(
                f"{self._label(index)}: destroy the MIG instances before disabling MIG"
            )
        if self._write("set_mig_mode", index):
            dev.mig_mode = enabled
            dev.mig_pending = None

    def list_gpu_instances(self, index: int) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self._dev(index).instances))

    def create_gpu_instance(self, index: int, profile: str, start: int | None = None) -> None:
        dev = self._dev(index)
        g = self.gpu_type(index)
        if not dev.mig_mode:
            raise MigLayoutError(f"{self._label(index)}: MIG mode is off; enable it first")
        try:
            p = g.mig_profile(profile)
        except KeyError:
            known = ", ".join(m.name for m in g.mig_profiles)
            raise MigLayoutError(
                f"{self._label(index)}: no MIG profile {profile!r} (known: {known})"
            ) from None
        names = [n for n, _ in dev.instances]
        if names.count(profile) + 1 > p.max_instances:
            raise MigLayoutError(
                f"{self._label(index)}: at most {p.max_instances} instance(s) of {profile}"
            )
        if start is None:
            placed = mig.place(g, [profile], fixed=dev.instances)
            at = placed[0][1] if placed else None
        else:
            ok = start in mig.starts(g, p)
            fits = ok and mig.place(g, [], fixed=[*dev.instances, (profile, start)]) is not None
            at = start if fits else None
        if at is None:
            where = "" if start is None else f" at memory slice {start}"
            raise MigLayoutError(
                f"{self._label(index)}: no room for {profile}{where} beside "
                f"{', '.join(f'{n}@{s}' for n, s in sorted(dev.instances)) or 'nothing'}"
            )
        if self._write("create_gpu_instance", index):
            dev.instances.append((profile, at))

    def destroy_gpu_instances(self, index: int) -> None:
        dev = self._dev(index)
        if not dev.instances:
            return
        if self._write("destroy_gpu_instances", index):
            dev.instances.clear()


class SimMps:
    """Fake MPS control: daemons live in the simulated host; writes count there too."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim

    def _index(self, pipe_dir: str) -> int:
        d = self.sim.mps_daemons.get(pipe_dir)
        return self.sim.index_of_uuid(d.device_uuid) if d else -1

    def is_running(self, pipe_dir: str) -> bool:
        return pipe_dir in self.sim.mps_daemons

    def start(self, pipe_dir: str, log_dir: str, device_uuid: str) -> None:
        if pipe_dir in self.sim.mps_daemons:
            raise MpsError(f"an MPS control daemon already runs on {pipe_dir}")
        if self.sim._write("mps_start", self.sim.index_of_uuid(device_uuid)):
            self.sim.mps_daemons[pipe_dir] = SimMpsDaemon(device_uuid, log_dir)

    def stop(self, pipe_dir: str) -> None:
        if pipe_dir not in self.sim.mps_daemons:
            return
        if self.sim._write("mps_stop", self._index(pipe_dir)):
            del self.sim.mps_daemons[pipe_dir]

    def get_default_percentage(self, pipe_dir: str) -> int:
        d = self.sim.mps_daemons.get(pipe_dir)
        if d is None:
            raise MpsError(f"no MPS control daemon on {pipe_dir}")
        return d.default_pct

    def set_default_percentage(self, pipe_dir: str, pct: int) -> None:
        d = self.sim.mps_daemons.get(pipe_dir)
        if d is None:
            raise MpsError(f"no MPS control daemon on {pipe_dir}")
        if self.sim._write("mps_set_default_percentage", self._index(pipe_dir)):
            d.default_pct = pct


class SimClock:
    """Simulated time: ``sleep`` advances the simulated host instantly."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.time_s

    def sleep(self, seconds: float) -> None:
        self.sim.advance(seconds)


def _default_limit_w(g: GpuType) -> float:
    return min(max(g.tdp_w, g.power_limit_min_w), g.power_limit_max_w)


def _limit_range_mw(g: GpuType) -> tuple[int, int]:
    """Lowest and highest power limit of ``g`` (mW)."""
    return round(g.power_limit_min_w * 1000), round(g.power_limit_max_w * 1000)
