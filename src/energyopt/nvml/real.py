"""The real backend on nvidia-ml-py (``pip install 'energyopt[nvml]'``).

``pynvml`` is imported only when this backend is opened. Every NVML error becomes
a typed ``ExecutorError`` naming the GPU and the setting. NVML has no getter for
locked clocks, so this backend reports them as "unknown" until it sets them itself.

MIG: GPU-instance profiles are found by asking the driver for every
``NVML_GPU_INSTANCE_PROFILE_*`` value (``+me`` ones included) and keyed by the name
in the v2 profile info; creating, listing and destroying instances then uses the
profile's ``info.id``, as nvml.h requires. Instances are created at explicit
placements (``nvmlDeviceCreateGpuInstanceWithPlacement``), each with one compute
instance of all its slices, and destroyed compute instances first, newest first.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
from dataclasses import dataclass
from typing import Any

from energyopt.nvml.backend import LockedClocks
from energyopt.nvml.errors import (
    BackendUnavailable,
    DeviceMapError,
    ExecutorError,
    MigLayoutError,
    NoPermission,
    NotSupported,
    NvmlCallFailed,
)

# nvml.h return codes (stable across driver versions).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25

#: NVML_GPU_INSTANCE_PROFILE_* enum values asked for when pynvml does not say how
#: many there are (0x0-0x11 in nvml.h of R570; 7 is 1_SLICE_REV1, the "+me" profile).
GI_PROFILE_COUNT_FALLBACK = 0x12
#: Enum values whose profile carries the media engines ("+me"): 1_SLICE_REV1,
#: 2_SLICE_REV1, 1_SLICE_ALL_ME, 2_SLICE_ALL_ME.
ME_PROFILES = (0x7, 0x8, 0xF, 0x10)
#: NVML_COMPUTE_INSTANCE_PROFILE_* enum values asked for when pynvml does not say
#: how many there are (0x0-0x8 in nvml.h of R570, 7_SLICE_NVL included).
CI_PROFILE_COUNT_FALLBACK = 0x9
# compute slices -> NVML_COMPUTE_INSTANCE_PROFILE_* enum value
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CLOCK_SM = 1  # NVML_CLOCK_SM
CLOCK_MEM = 2  # NVML_CLOCK_MEM
CI_ENGINE_SHARED = 0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


def translate(exc: Any, gpu: str, setting: str) -> ExecutorError:
    """The typed error for an ``NVMLError`` (anything with an int ``value``)."""
    code = int(getattr(exc, "value", -1))
    if code == ERROR_NO_PERMISSION:
        return NoPermission(gpu, setting)
    if code == ERROR_NOT_SUPPORTED:
        return NotSupported(gpu, setting)
    if code in (ERROR_DRIVER_NOT_LOADED, ERROR_LIBRARY_NOT_FOUND):
        return BackendUnavailable(
            f"{gpu}: NVML unavailable ({exc}): is the NVIDIA driver loaded? (nvidia-smi)"
        )
    if code == ERROR_GPU_IS_LOST:
        return NvmlCallFailed(f"{gpu}: the GPU has fallen off the bus while setting {setting}")
    if code == ERROR_RESET_REQUIRED:
        return NvmlCallFailed(
            f"{gpu}: {setting} needs a GPU reset: stop every process on it, then "
            "`nvidia-smi -r -i INDEX`"
        )
    if code == ERROR_IN_USE:
        return NvmlCallFailed(f"{gpu}: {setting}: the GPU is in use; stop the processes on it")
    if code == ERROR_INSUFFICIENT_RESOURCES:
        return MigLayoutError(f"{gpu}: {setting}: no room left on the GPU ({exc})")
    if code == ERROR_INVALID_ARGUMENT:
        return NvmlCallFailed(f"{gpu}: {setting}: the driver rejected the value ({exc})")
    return NvmlCallFailed(f"{gpu}: {setting} failed: {exc}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile as this GPU's driver reports it."""

    name: str  # "1g.10gb", "1g.10gb+me"
    enum: int  # NVML_GPU_INSTANCE_PROFILE_* value asked for
    id: int  # info.id: what nvmlDeviceCreateGpuInstance and nvmlDeviceGetGpuInstances take
    slices: int  # compute slices (info.sliceCount)
    instances: int  # most instances of this profile (info.instanceCount)


def _profile_name(info: Any, enum: int) -> str:
    """``1g.10gb``-style name: the driver's own (v2 info), else slices and memory.

    The fallback (drivers before the v2 info) rounds the instance memory up to
    GiB, which can miss NVIDIA's nominal name (``7g.79gb`` for ``7g.80gb``); creating
    a plan profile the driver does not list then fails and the apply is rolled back.
    """
    name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
    if name:
        return name
    gb = math.ceil(int(info.memorySizeMB) / 1024 - 0.3)
    return f"{int(info.sliceCount)}g.{gb}gb" + ("+me" if enum in ME_PROFILES else "")


class NvmlBackend:
    """Backend on ``pynvml``. Use ``open()`` and ``close()`` (or the session helper)."""

    kind = "nvml"

    def __init__(self) -> None:
        try:
            self.nv: Any = importlib.import_module("pynvml")
        except ImportError:
            raise BackendUnavailable(
                "nvidia-ml-py is not installed: pip install 'energyopt[nvml]' "
                "(or set ENERGYOPT_NVML_BACKEND=sim to try the simulated backend)"
            ) from None
        self._locked: dict[int, LockedClocks] = {}
        self._handles: dict[int, Any] = {}
        self._gi_profiles: dict[int, dict[str, GiProfile]] = {}

    def open(self) -> None:
        """Initialise NVML; BackendUnavailable without a driver or a GPU."""
        try:
            self.nv.nvmlInit()
        except Exception as exc:
            raise BackendUnavailable(
                f"NVML could not start ({exc}): no NVIDIA driver or GPU on this host? "
                "(check nvidia-smi; ENERGYOPT_NVML_BACKEND=sim runs the simulated backend)"
            ) from None
        if self.device_count() == 0:
            self.close()
            raise BackendUnavailable("NVML sees no NVIDIA GPU on this host")

    def close(self) -> None:
        """Shut NVML down (settings stay as they are)."""
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()

    def _label(self, index: int) -> str:
        try:
            return f"GPU {index} ({self.name(index)}, {self.uuid(index)})"
        except ExecutorError:
            return f"GPU {index}"

    def _call(self, index: int, setting: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nv, fn)(*args)
        except self.nv.NVMLError as exc:
            raise translate(exc, self._label(index), setting) from None

    def _h(self, index: int) -> Any:
        if index not in self._handles:
            try:
                self._handles[index] = self.nv.nvmlDeviceGetHandleByIndex(index)
            except self.nv.NVMLError as exc:
                raise DeviceMapError(f"no GPU with index {index}: {exc}") from None
        return self._handles[index]

    def device_count(self) -> int:
        try:
            return int(self.nv.nvmlDeviceGetCount())
        except self.nv.NVMLError as exc:
            raise translate(exc, "host", "device count") from None

    def index_of_uuid(self, uuid: str) -> int:
        for i in range(self.device_count()):
            if self.uuid(i) == uuid:
                return i
        raise DeviceMapError(f"no GPU with UUID {uuid} on this host (see `energyopt status`)")

    def name(self, index: int) -> str:
        try:
            return _text(self.nv.nvmlDeviceGetName(self._h(index)))
        except self.nv.NVMLError as exc:
            raise translate(exc, f"GPU {index}", "name") from None

    def uuid(self, index: int) -> str:
        try:
            return _text(self.nv.nvmlDeviceGetUUID(self._h(index)))
        except self.nv.NVMLError as exc:
            raise translate(exc, f"GPU {index}", "UUID") from None

    def get_persistence(self, index: int) -> bool:
        mode = self._call(index, "persistence mode", "nvmlDeviceGetPersistenceMode", self._h(index))
        return bool(mode)

    def set_persistence(self, index: int, enabled: bool) -> None:
        self._call(
            index, "persistence mode", "nvmlDeviceSetPersistenceMode", self._h(index), int(enabled)
        )

    def supported_sm_clocks(self, index: int) -> tuple[int, ...]:
        h = self._h(index)
        mems = self._call(index, "supported clocks", "nvmlDeviceGetSupportedMemoryClocks", h)
        clocks = self._call(
            index, "supported clocks", "nvmlDeviceGetSupportedGraphicsClocks", h, max(mems)
        )
        return tuple(sorted({int(c) for c in clocks}))

    def get_locked_clocks(self, index: int) -> LockedClocks:
        return self._locked.get(index, "unknown")

    def set_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        self._call(
            index,
            "locked SM clocks",
            "nvmlDeviceSetGpuLockedClocks",
            self._h(index),
            min_mhz,
            max_mhz,
        )
        self._locked[index] = (min_mhz, max_mhz)

    def reset_locked_clocks(self, index: int) -> None:
        self._call(index, "locked SM clocks", "nvmlDeviceResetGpuLockedClocks", self._h(index))
        self._locked[index] = None

    def get_power_limit(self, index: int) -> int:
        h = self._h(index)
        return int(self._call(index, "power limit", "nvmlDeviceGetPowerManagementLimit", h))

    def get_power_limit_constraints(self, index: int) -> tuple[int, int]:
        h = self._h(index)
        lo, hi = self._call(index, "power limit", "nvmlDeviceGetPowerManagementLimitConstraints", h)
        return int(lo), int(hi)

    def set_power_limit(self, index: int, limit_mw: int) -> None:
        h = self._h(index)
        self._call(index, "power limit", "nvmlDeviceSetPowerManagementLimit", h, limit_mw)

    def get_power_usage(self, index: int) -> int:
        return int(self._call(index, "power usage", "nvmlDeviceGetPowerUsage", self._h(index)))

    def get_total_energy(self, index: int) -> int:
        h = self._h(index)
        return int(self._call(index, "energy counter", "nvmlDeviceGetTotalEnergyConsumption", h))

    def get_sm_clock(self, index: int) -> int:
        h = self._h(index)
        return int(self._call(index, "SM clock", "nvmlDeviceGetClockInfo", h, CLOCK_SM))

    def mig_supported(self, index: int) -> bool:
        try:
            self.nv.nvmlDeviceGetMigMode(self._h(index))
        except self.nv.NVMLError as exc:
            if int(getattr(exc, "value", -1)) == ERROR_NOT_SUPPORTED:
                return False
            raise translate(exc, self._label(index), "MIG mode") from None
        return True

    def get_mig_mode(self, index: int) -> bool:
        current, _pending = self._call(index, "MIG mode", "nvmlDeviceGetMigMode", self._h(index))
        return bool(current)

    def get_mig_pending(self, index: int) -> bool:
        _current, pending = self._call(index, "MIG mode", "nvmlDeviceGetMigMode", self._h(index))
        return bool(pending)

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        h = self._h(index)
        before = self.get_mig_mode(index)
        self._call(index, "MIG mode", "nvmlDeviceSetMigMode", h, int(enabled))
        current, pending = self._call(index, "MIG mode", "nvmlDeviceGetMigMode", h)
        if bool(current) != enabled:
            if bool(pending) != before:  # withdraw the pending change: leave the GPU as it was
                self._call(index, "MIG mode", "nvmlDeviceSetMigMode", h, int(before))
            raise NvmlCallFailed(
                f"{self._label(index)}: the MIG mode change needs a GPU reset: stop every "
                f"process on the GPU, run `nvidia-smi -i {index} -mig {int(enabled)}` and "
                f"`nvidia-smi -r -i {index}`, then apply again"
            )

    def _profiles(self, index: int) -> dict[str, GiProfile]:
        """Profile name -> GPU-instance profile, for every profile this GPU has (+me too)."""
        if index in self._gi_profiles:
            return self._gi_profiles[index]
        out: dict[str, GiProfile] = {}
        count = int(getattr(self.nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", GI_PROFILE_COUNT_FALLBACK))
        h = self._h(index)
        for enum in range(count):
            info = self._profile_info(h, enum)
            if info is None:
                continue
            prof = GiProfile(
                name=_profile_name(info, enum),
                enum=enum,
                id=int(info.id),
                slices=int(info.sliceCount),
                instances=int(info.instanceCount),
            )
            if all(p.id != prof.id for p in out.values()):
                out.setdefault(prof.name, prof)
        if out:  # some drivers list no profiles while MIG is off: ask again later
            self._gi_profiles[index] = out
        return out

    def _profile_info(self, h: Any, enum: int) -> Any:
        """v2 profile info (it has the name), v1 on drivers without it; None: no such profile."""
        for version in (2, 1):
            try:
                try:
                    return self.nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum, version)
                except TypeError:  # a pynvml without the version argument (v1 only)
                    return self.nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
            except self.nv.NVMLError as exc:
                code = int(getattr(exc, "value", -1))
                if code in (ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH):
                    continue
                if code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT, ERROR_NOT_FOUND):
                    return None
                raise
        return None

    def _profile(self, index: int, name: str) -> GiProfile:
        profiles = self._profiles(index)
        if name not in profiles:
            known = ", ".join(profiles) or "none"
            raise MigLayoutError(f"{self._label(index)}: no MIG profile {name} (driver: {known})")
        return profiles[name]

    def _gpu_instances(self, index: int) -> list[tuple[GiProfile, Any, Any]]:
        """(profile, GPU instance handle, its info) of every GPU instance, by profile."""
        h = self._h(index)
        out: list[tuple[GiProfile, Any, Any]] = []
        for prof in self._profiles(index).values():
            handles = (self.nv.c_nvmlGpuInstance_t * max(prof.instances, 1))()
            count = ctypes.c_uint(0)
            self._call(
                index,
                "MIG instances",
                "nvmlDeviceGetGpuInstances",
                h,
                prof.id,
                handles,
                ctypes.byref(count),
            )
            for gi in handles[: count.value]:
                info = self._call(index, "MIG instances", "nvmlGpuInstanceGetInfo", gi)
                out.append((prof, gi, info))
        return out

    def list_gpu_instances(self, index: int) -> tuple[tuple[str, int], ...]:
        if not self.get_mig_mode(index):
            return ()
        placed = [
            (prof.name, int(info.placement.start)) for prof, _, info in self._gpu_instances(index)
        ]
        return tuple(sorted(placed))

    def _placement(self, index: int, prof: GiProfile, start: int) -> Any:
        """The driver's placement of ``prof`` at memory slice ``start``."""
        h = self._h(index)
        count = ctypes.c_uint(0)
        try:
            self.nv.nvmlDeviceGetGpuInstancePossiblePlacements(
                h, prof.id, None, ctypes.byref(count)
            )
        except self.nv.NVMLError as exc:
            if int(getattr(exc, "value", -1)) != ERROR_INSUFFICIENT_SIZE:
                raise translate(exc, self._label(index), f"MIG placements of {prof.name}") from None
        places = (self.nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        self._call(
            index,
            f"MIG placements of {prof.name}",
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            h,
            prof.id,
            places,
            ctypes.byref(count),
        )
        for place in places[: count.value]:
            if int(place.start) == start:
                return place
        allowed = ", ".join(str(int(p.start)) for p in places[: count.value])
        raise MigLayoutError(
            f"{self._label(index)}: {prof.name} cannot start at memory slice {start} "
            f"(allowed: {allowed})"
        )

    def create_gpu_instance(self, index: int, profile: str, start: int | None = None) -> None:
        prof = self._profile(index, profile)
        h = self._h(index)
        what = f"MIG instance {profile}" + ("" if start is None else f" at memory slice {start}")
        if start is None:
            gi = self._call(index, what, "nvmlDeviceCreateGpuInstance", h, prof.id)
        else:
            place = self._placement(index, prof, start)
            gi = self._call(
                index,
                what,
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                h,
                prof.id,
                ctypes.byref(place),
            )
        try:
            ci_info = self._call(
                index,
                f"MIG compute instance of {profile}",
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                CI_PROFILE_BY_SLICES[prof.slices],
                CI_ENGINE_SHARED,
            )
            self._call(
                index,
                f"MIG compute instance of {profile}",
                "nvmlGpuInstanceCreateComputeInstance",
                gi,
                ci_info.id,
            )
        except BaseException:
            self._call(index, what, "nvmlGpuInstanceDestroy", gi)
            raise

    def _destroy_compute_instances(self, index: int, gi: Any) -> None:
        profiles = getattr(
            self.nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", CI_PROFILE_COUNT_FALLBACK
        )
        for ci_enum in range(int(profiles)):
            try:
                info = self.nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_enum, CI_ENGINE_SHARED
                )
            except self.nv.NVMLError as exc:
                if int(getattr(exc, "value", -1)) in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    continue
                raise translate(exc, self._label(index), "MIG compute instances") from None
            handles = (self.nv.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            self._call(
                index,
                "MIG compute instances",
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                info.id,
                handles,
                ctypes.byref(count),
            )
            for ci in reversed(handles[: count.value]):
                self._call(index, "MIG compute instance", "nvmlComputeInstanceDestroy", ci)

    def destroy_gpu_instances(self, index: int) -> None:
        if not self.get_mig_mode(index):
            return
        found = self._gpu_instances(index)
        for _prof, gi, _info in sorted(found, key=lambda f: -int(f[2].id)):
            self._destroy_compute_instances(index, gi)
            self._call(index, "MIG instance", "nvmlGpuInstanceDestroy", gi)
