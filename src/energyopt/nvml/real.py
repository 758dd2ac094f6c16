"""The real backend on nvidia-ml-py (``pip install 'energyopt[nvml]'``).

``pynvml`` is imported only when this backend is opened. Every NVML error becomes
a typed ``ExecutorError`` naming the GPU and the setting. NVML has no getter for
locked clocks, so this backend reports them as "unknown" until it sets them itself.
"""

from __future__ import annotations

import contextlib
import importlib
import re
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
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23

# NVML_GPU_INSTANCE_PROFILE_* ids; 7 and 8 are the "+me" media variants.
GI_PROFILE_IDS = (0, 1, 2, 3, 4, 5, 6, 9)
# compute slices -> NVML_COMPUTE_INSTANCE_PROFILE_* id
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


def _parse_profile(name: str) -> tuple[int, float]:
    m = re.fullmatch(r"(\d+)g\.(\d+)gb", name)
    if m is None:
        raise MigLayoutError(f"MIG profile {name!r} is not of the form <N>g.<M>gb")
    return int(m.group(1)), float(m.group(2))


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

    def _profiles(self, index: int) -> dict[int, Any]:
        """GPU-instance profile id -> profile info, for the profiles this GPU has."""
        out: dict[int, Any] = {}
        for pid in GI_PROFILE_IDS:
            try:
                out[pid] = self.nv.nvmlDeviceGetGpuInstanceProfileInfo(self._h(index), pid)
            except self.nv.NVMLError:
                continue
        return out

    def _profile_id(self, index: int, name: str) -> int:
        slices, mem_gb = _parse_profile(name)
        cands = [(pid, info) for pid, info in self._profiles(index).items()]
        cands = [(pid, info) for pid, info in cands if int(info.sliceCount) == slices]
        if not cands:
            raise MigLayoutError(f"{self._label(index)}: no MIG profile {name}")
        best = min(cands, key=lambda c: abs(int(c[1].memorySizeMB) / 1024 - mem_gb))
        return best[0]

    def _profile_name(self, index: int, pid: int) -> str:
        """``1g.10gb``-style name: NVML's own (v2 info) when the driver has it."""
        try:
            info = self.nv.nvmlDeviceGetGpuInstanceProfileInfoV(self._h(index), pid)
            name = _text(getattr(info, "name", "")).removeprefix("MIG ").strip()
            if name:
                return name
        except (AttributeError, self.nv.NVMLError):
            pass
        info = self._profiles(index)[pid]
        return f"{int(info.sliceCount)}g.{round(int(info.memorySizeMB) / 1000)}gb"

    def list_gpu_instances(self, index: int) -> tuple[str, ...]:
        if not self.get_mig_mode(index):
            return ()
        names: list[str] = []
        for pid in self._profiles(index):
            gis = self._call(
                index, "MIG instances", "nvmlDeviceGetGpuInstances", self._h(index), pid
            )
            names.extend(self._profile_name(index, pid) for _ in gis)
        return tuple(sorted(names))

    def create_gpu_instance(self, index: int, profile: str) -> None:
        pid = self._profile_id(index, profile)
        h = self._h(index)
        gi = self._call(index, f"MIG instance {profile}", "nvmlDeviceCreateGpuInstance", h, pid)
        slices, _ = _parse_profile(profile)
        try:
            ci_info = self._call(
                index,
                f"MIG compute instance {profile}",
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                CI_PROFILE_BY_SLICES[slices],
                CI_ENGINE_SHARED,
            )
            self._call(
                index,
                f"MIG compute instance {profile}",
                "nvmlGpuInstanceCreateComputeInstance",
                gi,
                ci_info.id,
            )
        except BaseException:
            self._call(index, f"MIG instance {profile}", "nvmlGpuInstanceDestroy", gi)
            raise

    def destroy_gpu_instances(self, index: int) -> None:
        if not self.get_mig_mode(index):
            return
        h = self._h(index)
        for pid in self._profiles(index):
            for gi in self._call(index, "MIG instances", "nvmlDeviceGetGpuInstances", h, pid):
                for ci_pid in CI_PROFILE_BY_SLICES.values():
                    try:
                        cis = self.nv.nvmlGpuInstanceGetComputeInstances(gi, ci_pid)
                    except self.nv.NVMLError:
                        continue
                    for ci in cis:
                        self._call(index, "MIG compute instance", "nvmlComputeInstanceDestroy", ci)
                self._call(index, "MIG instance", "nvmlGpuInstanceDestroy", gi)
