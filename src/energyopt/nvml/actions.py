"""Actions: one setting of one GPU, with read, apply, read-back and undo.

Values (targets and originals) are JSON-ready so a checkpoint can store them.
Units: clocks in MHz, power limits in mW, MPS shares in percent of SMs.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from energyopt.nvml.backend import Backend, MpsControl
from energyopt.nvml.errors import CheckpointError, VerifyFailed

Json = Any


@dataclass(frozen=True)
class Ctx:
    """What actions act on: the NVML backend and the MPS control."""

    nvml: Backend
    mps: MpsControl


@dataclass(frozen=True)
class Action(abc.ABC):
    """A setting of GPU ``index`` (``uuid``), named ``gpu`` in the plan (abstract)."""

    kind: ClassVar[str] = ""
    gpu: str
    index: int
    uuid: str

    @abc.abstractmethod
    def target(self) -> Json:
        """The value this action sets."""
        ...

    @abc.abstractmethod
    def read(self, ctx: Ctx) -> Json:
        """The current value."""
        ...

    @abc.abstractmethod
    def apply(self, ctx: Ctx) -> None:
        """Write the target."""
        ...

    @abc.abstractmethod
    def undo(self, ctx: Ctx, original: Json) -> None:
        """Put the setting back to ``original`` (only writes what differs)."""
        ...

    @abc.abstractmethod
    def describe(self) -> str:
        """What the action does, for people."""
        ...

    def show(self, value: Json) -> str:
        """A value of this setting, for people."""
        return str(value)

    def is_noop(self, original: Json) -> bool:
        """Whether the device already has the target."""
        return bool(original == self.target())

    def verify(self, ctx: Ctx) -> None:
        """Read the setting back; VerifyFailed if it is not the target."""
        got = self.read(ctx)
        if got != self.target():
            raise VerifyFailed(
                f"{self.where()}: read back {self.show(got)} after setting "
                f"{self.show(self.target())} ({self.describe()})"
            )

    def where(self) -> str:
        """The GPU, for messages."""
        return f"{self.gpu} (GPU {self.index}, {self.uuid})"

    def to_json(self) -> dict[str, Json]:
        """The action as a checkpoint entry."""
        data = dataclasses.asdict(self)
        data["kind"] = self.kind
        return data


@dataclass(frozen=True)
class SetPersistence(Action):
    """Persistence mode, so settings survive while no process holds the GPU."""

    kind: ClassVar[str] = "persistence"
    enabled: bool = True

    def target(self) -> Json:
        return self.enabled

    def read(self, ctx: Ctx) -> Json:
        return ctx.nvml.get_persistence(self.index)

    def apply(self, ctx: Ctx) -> None:
        ctx.nvml.set_persistence(self.index, self.enabled)

    def undo(self, ctx: Ctx, original: Json) -> None:
        if self.read(ctx) != original:
            ctx.nvml.set_persistence(self.index, bool(original))

    def describe(self) -> str:
        return f"set persistence mode {'on' if self.enabled else 'off'}"

    def show(self, value: Json) -> str:
        return "on" if value else "off"


@dataclass(frozen=True)
class LockClocks(Action):
    """Locked SM clocks, min = max = ``clock_mhz`` (nvmlDeviceSetGpuLockedClocks)."""

    kind: ClassVar[str] = "lock_clocks"
    clock_mhz: int = 0

    def target(self) -> Json:
        return [self.clock_mhz, self.clock_mhz]

    def read(self, ctx: Ctx) -> Json:
        got = ctx.nvml.get_locked_clocks(self.index)
        return list(got) if isinstance(got, tuple) else got

    def apply(self, ctx: Ctx) -> None:
        ctx.nvml.set_locked_clocks(self.index, self.clock_mhz, self.clock_mhz)

    def undo(self, ctx: Ctx, original: Json) -> None:
        current = self.read(ctx)
        if original is None or original == "unknown":
            if current is not None:
                ctx.nvml.reset_locked_clocks(self.index)
        elif current != original:
            ctx.nvml.set_locked_clocks(self.index, int(original[0]), int(original[1]))

    def describe(self) -> str:
        return f"lock SM clocks at {self.clock_mhz} MHz"

    def show(self, value: Json) -> str:
        if value is None:
            return "unlocked"
        if value == "unknown":
            return "not readable through NVML"
        lo, hi = value
        return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"


@dataclass(frozen=True)
class SetPowerLimit(Action):
    """Power management limit in mW (within nvmlDeviceGetPowerManagementLimitConstraints)."""

    kind: ClassVar[str] = "power_limit"
    limit_mw: int = 0

    def target(self) -> Json:
        return self.limit_mw

    def read(self, ctx: Ctx) -> Json:
        return ctx.nvml.get_power_limit(self.index)

    def apply(self, ctx: Ctx) -> None:
        ctx.nvml.set_power_limit(self.index, self.limit_mw)

    def undo(self, ctx: Ctx, original: Json) -> None:
        if self.read(ctx) != original:
            ctx.nvml.set_power_limit(self.index, int(original))

    def describe(self) -> str:
        return f"set power limit to {self.limit_mw / 1000:g} W"

    def show(self, value: Json) -> str:
        return f"{int(value) / 1000:g} W"


def _slices(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


@dataclass(frozen=True)
class ConfigureMig(Action):
    """MIG mode and the GPU instances (each with one full compute instance), by profile."""

    kind: ClassVar[str] = "mig"
    enabled: bool = True
    instances: tuple[str, ...] = ()

    def target(self) -> Json:
        return {"enabled": self.enabled, "instances": sorted(self.instances)}

    def read(self, ctx: Ctx) -> Json:
        enabled = ctx.nvml.get_mig_mode(self.index)
        instances = sorted(ctx.nvml.list_gpu_instances(self.index)) if enabled else []
        return {"enabled": enabled, "instances": instances}

    def _reach(self, ctx: Ctx, state: Json) -> None:
        current = self.read(ctx)
        if current == state:
            return
        if current["instances"]:
            ctx.nvml.destroy_gpu_instances(self.index)
        if current["enabled"] != state["enabled"]:
            ctx.nvml.set_mig_mode(self.index, bool(state["enabled"]))
        for profile in sorted(state["instances"], key=lambda p: (-_slices(p), p)):
            ctx.nvml.create_gpu_instance(self.index, profile)

    def apply(self, ctx: Ctx) -> None:
        self._reach(ctx, self.target())

    def undo(self, ctx: Ctx, original: Json) -> None:
        self._reach(ctx, original)

    def describe(self) -> str:
        if not self.enabled:
            return "disable MIG"
        return f"enable MIG with instances {', '.join(self.instances) or '(none)'}"

    def show(self, value: Json) -> str:
        if not value["enabled"]:
            return "MIG off"
        return f"MIG on: {', '.join(value['instances']) or 'no instances'}"


@dataclass(frozen=True)
class ConfigureMps(Action):
    """An MPS control daemon for this GPU and its default active-thread percentage.

    ``clients`` lists (workload, percent of SMs); each serving process must be
    started with ``mps.client_env`` for its share.
    """

    kind: ClassVar[str] = "mps"
    pipe_dir: str = ""
    log_dir: str = ""
    default_pct: int = 100
    clients: tuple[tuple[str, int], ...] = ()

    def target(self) -> Json:
        return {"running": True, "default_pct": self.default_pct}

    def read(self, ctx: Ctx) -> Json:
        running = ctx.mps.is_running(self.pipe_dir)
        pct = ctx.mps.get_default_percentage(self.pipe_dir) if running else None
        return {"running": running, "default_pct": pct}

    def apply(self, ctx: Ctx) -> None:
        if not ctx.mps.is_running(self.pipe_dir):
            ctx.mps.start(self.pipe_dir, self.log_dir, self.uuid)
        if ctx.mps.get_default_percentage(self.pipe_dir) != self.default_pct:
            ctx.mps.set_default_percentage(self.pipe_dir, self.default_pct)

    def undo(self, ctx: Ctx, original: Json) -> None:
        running = ctx.mps.is_running(self.pipe_dir)
        if not original["running"]:
            if running:
                ctx.mps.stop(self.pipe_dir)
            return
        if not running:
            ctx.mps.start(self.pipe_dir, self.log_dir, self.uuid)
        pct = original["default_pct"]
        if pct is not None and ctx.mps.get_default_percentage(self.pipe_dir) != pct:
            ctx.mps.set_default_percentage(self.pipe_dir, int(pct))

    def describe(self) -> str:
        shares = ", ".join(f"{w} {p}%" for w, p in self.clients)
        return (
            f"run an MPS control daemon (pipe {self.pipe_dir}), default active-thread "
            f"percentage {self.default_pct}% (clients: {shares})"
        )

    def show(self, value: Json) -> str:
        if not value["running"]:
            return "no MPS daemon"
        return f"MPS daemon running, default {value['default_pct']}%"


ACTION_TYPES: dict[str, type[Action]] = {
    cls.kind: cls for cls in (SetPersistence, LockClocks, SetPowerLimit, ConfigureMig, ConfigureMps)
}


def action_from_json(data: dict[str, Json]) -> Action:
    """Rebuild an action from a checkpoint entry."""
    data = dict(data)
    cls = ACTION_TYPES.get(str(data.pop("kind", "")))
    if cls is None:
        raise CheckpointError(f"unknown action in checkpoint: {data}")
    if "instances" in data:
        data["instances"] = tuple(data["instances"])
    if "clients" in data:
        data["clients"] = tuple((str(w), int(p)) for w, p in data["clients"])
    try:
        return cls(**data)
    except TypeError as exc:
        raise CheckpointError(f"bad action in checkpoint ({exc}): {data}") from None
