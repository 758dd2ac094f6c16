"""Plan -> devices of this host -> the actions that put the plan on them.

Every check that can be made before a write is made here (device type, supported
clocks, power-limit range, MIG layout by NVIDIA's placements, a pending MIG mode
change), so a bad plan fails before anything changes.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from energyopt.catalog import mig
from energyopt.catalog.loader import Catalog
from energyopt.catalog.mig import Placed
from energyopt.nvml.actions import (
    Action,
    ConfigureMig,
    ConfigureMps,
    LockClocks,
    SetPersistence,
    SetPowerLimit,
)
from energyopt.nvml.backend import Backend
from energyopt.nvml.errors import (
    ClockNotSupported,
    DeviceMapError,
    MigLayoutError,
    NotSupported,
    PowerLimitOutOfRange,
)
from energyopt.nvml.mps import DEFAULT_BASE_DIR, client_env, mps_dirs
from energyopt.nvml.names import name_matches
from energyopt.spec.errors import SpecError
from energyopt.spec.io import read_data
from energyopt.spec.plan import GpuPlan, Plan


@dataclass(frozen=True)
class Device:
    """A physical GPU of this host."""

    index: int
    uuid: str
    name: str


@dataclass
class HostPlan:
    """The actions for this host, plus what a person needs to know about them."""

    actions: list[Action] = field(default_factory=list)
    devices: dict[str, Device] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    client_envs: dict[str, list[tuple[str, dict[str, str]]]] = field(default_factory=dict)


def parse_map_options(options: list[str]) -> dict[str, str]:
    """``plan_gpu=index|uuid`` options -> {plan_gpu: index-or-uuid}."""
    out: dict[str, str] = {}
    for opt in options:
        gpu, sep, dev = opt.partition("=")
        if not sep or not gpu.strip() or not dev.strip():
            raise DeviceMapError(f"--map {opt!r}: expected PLAN_GPU=INDEX or PLAN_GPU=UUID")
        out[gpu.strip()] = dev.strip()
    return out


def read_map_file(path: str | Path, plan_gpus: Collection[str] | None = None) -> dict[str, str]:
    """A mapping file: a YAML/JSON/TOML table ``{plan_gpu: index or uuid}``.

    SpecError naming the file and the key for a key that is not a string (YAML reads
    ``0:`` as a number), one that is not among ``plan_gpus`` (when given), and a value
    that is neither a device index nor a UUID (a date, binary data, a list...)."""
    data = read_data(path)
    problems: list[str] = []
    out: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key.strip():
            problems.append(
                f"{path}: {key!r}: a key is a plan GPU id, a string such as 'node0/0' "
                "(quote it in YAML)"
            )
            continue
        where = f"{path}: {key}"
        if plan_gpus is not None and key not in plan_gpus:
            problems.append(f"{where}: not a GPU of the plan (plan GPUs: {_listed(plan_gpus)})")
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                problems.append(f"{where}: device index {value} is negative")
                continue
            out[key] = str(value)
        elif isinstance(value, str) and value.strip():
            out[key] = value.strip()
        else:
            problems.append(
                f"{where}: expected a device index (a whole number) or a UUID (a string), "
                f"got {_described(value)}"
            )
    if problems:
        raise SpecError(problems)
    return out


def _listed(names: Collection[str], most: int = 6) -> str:
    shown = list(names)[:most]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _described(value: Any) -> str:
    """What a parsed value is, in words, for a mapping file's messages."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, str):
        return "an empty string"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, bytes):
        return "binary data (!!binary)"
    if isinstance(value, datetime.date):
        return f"a date or timestamp ({value}; quote a UUID that looks like one)"
    if isinstance(value, float):
        return f"a fractional number ({value:g})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _device(backend: Backend, ref: str) -> Device:
    n = backend.device_count()
    if ref.isdigit():
        index = int(ref)
        if index >= n:
            raise DeviceMapError(f"no GPU with index {index}: this host has {n} (0..{n - 1})")
    else:
        index = backend.index_of_uuid(ref)
    return Device(index, backend.uuid(index), backend.name(index))


def map_devices(
    plan: Plan,
    backend: Backend,
    mapping: dict[str, str] | None,
    origins: Mapping[str, str] | None = None,
) -> dict[str, Device]:
    """Plan GPU id -> device. Without a mapping, plan order is device index order.

    With a mapping, only the mapped plan GPUs are on this host. The device's name
    must match the plan GPU's type either way. ``origins`` says where each plan GPU's
    mapping was given (``map.yaml: node0/0``, ``--map node0/0``), for the messages.
    """
    known = {g.gpu for g in plan.gpus}
    if mapping:
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise DeviceMapError(
                f"mapping names GPUs not in the plan: {', '.join(unknown)} "
                f"(plan GPUs: {', '.join(g.gpu for g in plan.gpus)})"
            )
        pairs = []
        for g in plan.gpus:
            if g.gpu not in mapping:
                continue
            try:
                pairs.append((g, _device(backend, mapping[g.gpu])))
            except DeviceMapError as exc:
                origin = (origins or {}).get(g.gpu)
                if origin is None:
                    raise
                raise DeviceMapError(f"{origin}: {exc}") from None
    else:
        n = backend.device_count()
        if len(plan.gpus) > n:
            raise DeviceMapError(
                f"the plan has {len(plan.gpus)} GPUs but this host has {n}: say which plan "
                "GPUs are here with --map PLAN_GPU=INDEX|UUID (or --map-file)"
            )
        pairs = [(g, _device(backend, str(i))) for i, g in enumerate(plan.gpus)]
    seen: dict[int, str] = {}
    for g, dev in pairs:
        if dev.index in seen:
            raise DeviceMapError(f"{g.gpu} and {seen[dev.index]} both map to GPU {dev.index}")
        seen[dev.index] = g.gpu
        if not name_matches(g.type, dev.name):
            raise DeviceMapError(
                f"plan GPU {g.gpu} is a {g.type} but GPU {dev.index} is {dev.name!r} "
                f"({dev.uuid}); map it to a matching device with --map {g.gpu}=INDEX|UUID"
            )
    return {g.gpu: dev for g, dev in pairs}


def _nearest(clocks: tuple[int, ...], clock: int) -> tuple[int, ...]:
    below = [c for c in clocks if c < clock]
    above = [c for c in clocks if c > clock]
    return tuple(([below[-1]] if below else []) + ([above[0]] if above else []))


def _mig_layout(g: GpuPlan, dev: Device, catalog: Catalog, profiles: list[str]) -> list[Placed]:
    """The instances of ``profiles`` with their start memory slices, in creation order.

    Raises MigLayoutError when the layout cannot be created (the same rule as the
    verifier: NVIDIA's placements, memory and compute slices, instance limits).
    """
    label = f"{g.gpu} (GPU {dev.index})"
    try:
        gtype = catalog.gpu(g.type)
    except KeyError as exc:
        raise MigLayoutError(f"{label}: {exc.args[0]} (add it with --catalog)") from None
    reason = mig.layout_problem(gtype, profiles)
    placed = mig.place(gtype, profiles) if reason is None else None
    if placed is None:
        raise MigLayoutError(f"{label}: {reason}")
    return placed


def _check_pending(backend: Backend, label: str, index: int) -> None:
    """MigLayoutError when a MIG mode change waits for a GPU reset (nothing is written)."""
    current, pending = backend.get_mig_mode(index), backend.get_mig_pending(index)
    if current == pending:
        return
    state = "enabled" if pending else "disabled"
    raise MigLayoutError(
        f"{label}: MIG is {'on' if current else 'off'} but {state} is pending until the GPU "
        f"is reset; stop every process on the GPU and run `nvidia-smi -r -i {index}` to "
        f"finish the change, or `nvidia-smi -i {index} -mig {int(current)}` to withdraw it, "
        "then apply again"
    )


def gpu_actions(
    g: GpuPlan, dev: Device, backend: Backend, catalog: Catalog, mps_base: str
) -> tuple[list[Action], list[tuple[str, dict[str, str]]]]:
    """Actions for one plan GPU on ``dev`` (checked against the device), and MPS client envs."""
    gpu, idx, uuid = g.gpu, dev.index, dev.uuid
    label = f"{g.gpu} (GPU {dev.index}, {dev.uuid})"
    actions: list[Action] = [SetPersistence(gpu, idx, uuid, enabled=True)]
    envs: list[tuple[str, dict[str, str]]] = []
    mig = [p.mig_profile for p in g.placements if p.mig_profile]
    if mig and len(mig) != len(g.placements):
        raise MigLayoutError(f"{label}: some placements have a MIG profile and some do not")
    if mig:
        if not backend.mig_supported(dev.index):
            raise NotSupported(label, "MIG")
        placed = _mig_layout(g, dev, catalog, mig)
        _check_pending(backend, label, dev.index)
        actions.append(
            ConfigureMig(
                gpu,
                idx,
                uuid,
                enabled=True,
                instances=tuple(n for n, _ in placed),
                placements=tuple(s for _, s in placed),
            )
        )
    elif backend.mig_supported(dev.index):
        _check_pending(backend, label, dev.index)
        actions.append(ConfigureMig(gpu, idx, uuid, enabled=False, instances=()))
    if g.clock_mhz is not None:
        clocks = backend.supported_sm_clocks(dev.index)
        if g.clock_mhz not in clocks:
            raise ClockNotSupported(label, g.clock_mhz, _nearest(clocks, g.clock_mhz))
        actions.append(LockClocks(gpu, idx, uuid, clock_mhz=g.clock_mhz))
    if g.power_limit_w is not None:
        limit_mw = round(g.power_limit_w * 1000)
        lo, hi = backend.get_power_limit_constraints(dev.index)
        if not lo <= limit_mw <= hi:
            raise PowerLimitOutOfRange(label, limit_mw, lo, hi)
        actions.append(SetPowerLimit(gpu, idx, uuid, limit_mw=limit_mw))
    shared = not mig and (len(g.placements) > 1 or any(p.share_pct < 100 for p in g.placements))
    if shared:
        pipe, log = mps_dirs(mps_base, dev.uuid)
        clients = tuple((p.workload, p.share_pct) for p in g.placements)
        default = min(p for _, p in clients)
        actions.append(
            ConfigureMps(gpu, idx, uuid, pipe, log, default_pct=default, clients=clients)
        )
        envs = [(w, client_env(mps_base, dev.uuid, p)) for w, p in clients]
    return actions, envs


def plan_actions(
    plan: Plan,
    backend: Backend,
    catalog: Catalog,
    mapping: dict[str, str] | None = None,
    mps_base: str = DEFAULT_BASE_DIR,
    origins: Mapping[str, str] | None = None,
) -> HostPlan:
    """Every action that puts ``plan`` on this host, in order; raises before any write
    (``origins``: where each mapping was given, as ``map_devices`` takes it)."""
    out = HostPlan(devices=map_devices(plan, backend, mapping, origins))
    for g in plan.gpus:
        dev = out.devices.get(g.gpu)
        if dev is None:
            continue
        if not g.on:
            out.notes.append(
                f"{g.gpu} (GPU {dev.index}) is off in the plan: left unchanged (NVML cannot "
                "power a GPU off; drain it and power it down out of band)"
            )
            continue
        actions, envs = gpu_actions(g, dev, backend, catalog, mps_base)
        out.actions.extend(actions)
        if envs:
            out.client_envs[g.gpu] = envs
    return out


def mig_parted_config(plan: Plan, devices: dict[str, Device], name: str) -> dict[str, Any]:
    """The plan's MIG layout in NVIDIA mig-parted format (``version: v1``)."""
    entries: list[dict[str, Any]] = []
    for g in plan.gpus:
        dev = devices.get(g.gpu)
        profiles = [p.mig_profile for p in g.placements if p.mig_profile]
        if dev is None or not g.on or not profiles:
            continue
        counts = {p: profiles.count(p) for p in sorted(set(profiles))}
        entries.append({"devices": [dev.index], "mig-enabled": True, "mig-devices": counts})
    return {"version": "v1", "mig-configs": {name: entries}}


def mig_parted_yaml(plan: Plan, devices: dict[str, Device], name: str) -> str:
    """``mig_parted_config`` as YAML text."""
    return yaml.safe_dump(mig_parted_config(plan, devices, name), sort_keys=False)
