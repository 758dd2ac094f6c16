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

    def is_original(self, value: Json, original: Json) -> bool:
        """Whether ``value`` (read from the device) is ``original`` (from a checkpoint)."""
        if original == "unknown":  # never readable: unlocked or never set counts
            return value is None or value == "unknown"
        return bool(value == original)

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


def _mig_state(enabled: bool, placed: list[list[Any]] | list[tuple[str, int]]) -> Json:
    pairs = sorted([str(n), int(s)] for n, s in placed)
    return {"enabled": enabled, "instances": [n for n, _ in pairs], "placements": pairs}


@dataclass(frozen=True)
class ConfigureMig(Action):
    """MIG mode and the GPU instances (each with one full compute instance), by profile.

    ``placements`` holds the start memory slice of each of ``instances`` (same
    order, the order of creation), chosen by the planner from NVIDIA's allowed
    positions; empty lets the driver choose. The state read from a GPU carries
    every instance's start, so an undo re-creates a layout exactly where it was.
    """

    kind: ClassVar[str] = "mig"
    enabled: bool = True
    instances: tuple[str, ...] = ()
    placements: tuple[int, ...] = ()

    def target(self) -> Json:
        if len(self.placements) == len(self.instances):
            return _mig_state(self.enabled, list(zip(self.instances, self.placements, strict=True)))
        return {"enabled": self.enabled, "instances": sorted(self.instances), "placements": None}

    def read(self, ctx: Ctx) -> Json:
        enabled = ctx.nvml.get_mig_mode(self.index)
        placed = list(ctx.nvml.list_gpu_instances(self.index)) if enabled else []
        return _mig_state(enabled, placed)

    def is_noop(self, original: Json) -> bool:
        """The same mode and profiles: where the instances sit does not matter to a plan."""
        return bool(
            original["enabled"] == self.enabled
            and sorted(original["instances"]) == sorted(self.instances)
        )

    def is_original(self, value: Json, original: Json) -> bool:
        """Same mode and instances where they were; by profile for checkpoints without starts."""
        if original.get("placements") is not None:
            return bool(value == original)
        return bool(
            value["enabled"] == original["enabled"]
            and sorted(value["instances"]) == sorted(original["instances"])
        )

    def verify(self, ctx: Ctx) -> None:
        got = self.read(ctx)
        if not self.is_noop(got):
            raise VerifyFailed(
                f"{self.where()}: read back {self.show(got)} after setting "
                f"{self.show(self.target())} ({self.describe()})"
            )

    def _reach(self, ctx: Ctx, state: Json) -> None:
        """Put the GPU in ``state`` (a ``read`` value): same mode, instances at the same starts."""
        current = self.read(ctx)
        if self.is_original(current, state):
            return
        if current["instances"]:
            ctx.nvml.destroy_gpu_instances(self.index)
        if current["enabled"] != state["enabled"]:
            ctx.nvml.set_mig_mode(self.index, bool(state["enabled"]))
        placed = state.get("placements")
        if placed is None:  # a checkpoint from before placements were recorded
            placed = [[name, None] for name in state["instances"]]
        for profile, start in placed:
            ctx.nvml.create_gpu_instance(
                self.index, str(profile), None if start is None else int(start)
            )

    def apply(self, ctx: Ctx) -> None:
        current = self.read(ctx)
        if self.is_noop(current):
            return
        if current["instances"]:
            ctx.nvml.destroy_gpu_instances(self.index)
        if current["enabled"] != self.enabled:
            ctx.nvml.set_mig_mode(self.index, self.enabled)
        placed = len(self.placements) == len(self.instances)
        starts: tuple[int | None, ...] = (
            self.placements if placed else (None,) * len(self.instances)
        )
        for profile, start in zip(self.instances, starts, strict=True):
            ctx.nvml.create_gpu_instance(self.index, profile, start)

    def undo(self, ctx: Ctx, original: Json) -> None:
        self._reach(ctx, original)

    def describe(self) -> str:
        if not self.enabled:
            return "disable MIG"
        if len(self.placements) == len(self.instances):
            where = ", ".join(
                f"{p} at memory slice {s}"
                for p, s in zip(self.instances, self.placements, strict=True)
            )
            return f"enable MIG with instances {where or '(none)'}"
        return f"enable MIG with instances {', '.join(self.instances) or '(none)'}"

    def show(self, value: Json) -> str:
        if not value["enabled"]:
            return "MIG off"
        placed = value.get("placements")
        if placed:
            return "MIG on: " + ", ".join(f"{n}@{s}" for n, s in placed)
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


def describe_json(value: Json) -> str:
    """What kind of JSON value ``value`` is, for messages ("a string", "null")."""
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _is_int(value: Json) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_problem(annotation: str, value: Json) -> str | None:
    """Why ``value`` (JSON) does not fit a field annotated ``annotation``; None if it does."""
    if annotation == "str":
        return None if isinstance(value, str) else f"expected a string, got {describe_json(value)}"
    if annotation == "int":
        return None if _is_int(value) else f"expected an integer, got {describe_json(value)}"
    if annotation == "bool":
        return (
            None if isinstance(value, bool) else f"expected a boolean, got {describe_json(value)}"
        )
    if not isinstance(value, list):
        return f"expected a list, got {describe_json(value)}"
    if annotation == "tuple[str, ...]" and not all(isinstance(v, str) for v in value):
        return "expected a list of strings"
    if annotation == "tuple[int, ...]" and not all(_is_int(v) for v in value):
        return "expected a list of integers"
    if annotation == "tuple[tuple[str, int], ...]" and not all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and _is_int(v[1])
        for v in value
    ):
        return "expected a list of [name, integer] pairs"
    return None


def _original_problem(kind: str, value: Json) -> str | None:
    """Why ``value`` cannot be the original of a setting of ``kind``; None if it can."""
    if kind == "persistence":
        return (
            None if isinstance(value, bool) else f"expected a boolean, got {describe_json(value)}"
        )
    if kind == "power_limit":
        return None if _is_int(value) else f"expected an integer (mW), got {describe_json(value)}"
    if kind == "lock_clocks":
        ok = value is None or value == "unknown"
        ok = ok or (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value))
        return None if ok else 'expected null, "unknown" or [min_mhz, max_mhz]'
    if not isinstance(value, dict):
        return f"expected an object, got {describe_json(value)}"
    if kind == "mig":
        if not isinstance(value.get("enabled"), bool):
            return "enabled: expected a boolean"
        if _field_problem("tuple[str, ...]", value.get("instances")) is not None:
            return "instances: expected a list of profile names"
        placed = value.get("placements")
        if placed is not None and _field_problem("tuple[tuple[str, int], ...]", placed):
            return "placements: expected a list of [profile, start] pairs"
        return None
    if not isinstance(value.get("running"), bool):
        return "running: expected a boolean"
    pct = value.get("default_pct")
    if pct is not None and not _is_int(pct):
        return "default_pct: expected an integer or null"
    return None


_RANGES = (
    ("index", 0, 2**31 - 1),
    ("clock_mhz", 1, 10_000),
    ("limit_mw", 1, 10_000_000),
    ("default_pct", 1, 100),
)
"""Integer fields of a checkpoint's actions and their ranges (a device index, MHz, mW,
percent of SMs); a start memory slice is checked against the GPU when it is used."""


def action_from_json(data: Json, where: str = "action") -> Action:
    """Rebuild an action from a checkpoint entry; CheckpointError names the bad field."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected an object, got {describe_json(data)}")
    data = dict(data)
    kind = data.pop("kind", None)
    cls = ACTION_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(ACTION_TYPES)
        raise CheckpointError(f"{where}.kind: unknown action {kind!r} (known: {known})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            raise CheckpointError(f"{where}.{name}: not a field of a {kind} action")
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING:
                raise CheckpointError(f"{where}.{name}: missing")
            continue
        problem = _field_problem(str(f.type), data[name])
        if problem is not None:
            raise CheckpointError(f"{where}.{name}: {problem}")
    for name in ("pipe_dir", "log_dir"):
        if name in fields and not data.get(name):
            raise CheckpointError(f"{where}.{name}: empty (expected the daemon's directory)")
    for name, low, high in _RANGES:
        value = data.get(name)
        if _is_int(value) and not low <= value <= high:
            raise CheckpointError(f"{where}.{name}: {value} is outside {low}..{high}")
    for k, client in enumerate(data.get("clients") or ()):
        if not 1 <= client[1] <= 100:
            raise CheckpointError(f"{where}.clients[{k}]: {client[1]} % is outside 1..100")
    for name in ("instances", "placements"):
        if name in data:
            data[name] = tuple(data[name])
    if "clients" in data:
        data["clients"] = tuple((str(w), int(p)) for w, p in data["clients"])
    return cls(**data)


def original_from_json(kind: str, value: Json, where: str = "original") -> Json:
    """``value`` if it can be the original of a ``kind`` setting; else CheckpointError."""
    problem = _original_problem(kind, value)
    if problem is not None:
        raise CheckpointError(f"{where}: {problem}")
    return value
