"""A fake NVML driver beneath the real nvidia-ml-py wrappers.

``FakeDriver.install`` replaces pynvml's function-pointer lookup
(``pynvml._nvmlGetFunctionPointer``) so that pynvml's own Python code runs
unchanged and only the C functions are fakes. Each fake takes the ctypes
arguments pynvml passes (values, ``byref`` out-parameters, arrays, structs) and
returns an ``nvmlReturn_t`` code as nvml.h documents it: out-parameters are
written through the pointers, size queries answer ``NVML_ERROR_INSUFFICIENT_SIZE``
with the needed count, versioned structs are checked against their version
constants, writes need root (``privileged``), and MIG follows the placement rules
of an 8-memory-slice GPU (A100, H100, H200): a GPU instance occupies the memory
slices of its placement and the driver refuses an overlap.

Fault injection: ``fail_write(k, code)`` makes the k-th write call (0-based,
counted from install) return ``code`` without any effect.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any

from energyopt.nvml.names import nvml_name
from energyopt.spec import GpuType

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_RESET_REQUIRED = 16
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25

GI_INFO_V2 = 0x02000098  # nvmlGpuInstanceProfileInfo_v2
CI_INFO_V2 = 0x02000088  # nvmlComputeInstanceProfileInfo_v2
GI_PROFILE_COUNT = 0x12

#: NVML_GPU_INSTANCE_PROFILE_* enum -> (profile id, compute slices, memory slices,
#: allowed starts, +me) on an 8-memory-slice GPU, as `nvidia-smi mig -lgip/-lgipp`
#: list them on A100 80GB, H100 80GB and H200.
GI_PROFILES: dict[int, tuple[int, int, int, tuple[int, ...], bool]] = {
    0x0: (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), False),  # 1_SLICE
    0x7: (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), True),  # 1_SLICE_REV1 (+me)
    0x9: (15, 1, 2, (0, 2, 4, 6), False),  # 1_SLICE_REV2 (double memory)
    0x1: (14, 2, 2, (0, 2, 4), False),  # 2_SLICE
    0x2: (9, 3, 4, (0, 4), False),  # 3_SLICE
    0x3: (5, 4, 4, (0,), False),  # 4_SLICE
    0x4: (0, 7, 8, (0,), False),  # 7_SLICE
}
#: NVML_COMPUTE_INSTANCE_PROFILE_* enum -> compute slices (the profile id is the enum;
#: 7 is 1_SLICE_REV1, 8 is 7_SLICE_NVL).
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}
MEMORY_CLOCK_MHZ = {"A100-SXM4-80GB": 1593, "H100-SXM5-80GB": 2619, "H200-SXM-141GB": 3201}

WRITES = {
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
}


def _val(x: Any) -> int:
    """An integer argument, passed as a Python int or a ctypes scalar."""
    return int(x.value) if hasattr(x, "value") else int(x)


def _obj(ref: Any) -> Any:
    """The ctypes object behind a ``byref`` or ``pointer`` out-parameter."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref


def _addr(handle: Any) -> int:
    """The address an opaque handle (a ctypes pointer) holds."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _put_pointer(ref: Any, addr: int) -> None:
    """Write a handle into a pointer out-parameter."""
    target = _obj(ref)
    ctypes.cast(ctypes.pointer(target), ctypes.POINTER(ctypes.c_void_p))[0] = addr


@dataclass
class FakeGi:
    """A GPU instance: profile id, placement, compute instances (id -> CI profile)."""

    id: int
    profile: int
    start: int
    size: int
    slices: int
    cis: dict[int, int] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """Driver state of one GPU."""

    gtype: GpuType
    uuid: str
    persistence: bool = False
    locked: tuple[int, int] | None = None
    power_limit_mw: int = 0
    mig_current: int = 0
    mig_pending: int = 0
    mig_needs_reset: bool = False  # a mode change waits for a reset (GPU busy)
    clocks_supported: bool = True
    gis: dict[int, FakeGi] = field(default_factory=dict)

    @property
    def mig_capable(self) -> bool:
        return bool(self.gtype.mig_profiles)


class FakeDriver:
    """libnvidia-ml as pynvml sees it, for the GPU types given."""

    def __init__(self, gpus: list[GpuType], privileged: bool = True) -> None:
        self.gpus = [
            FakeGpu(
                g,
                f"GPU-fa4e{i:04d}-0000-4000-8000-{i:012d}",
                power_limit_mw=round(min(g.tdp_w, g.power_limit_max_w) * 1000),
            )
            for i, g in enumerate(gpus)
        ]
        self.privileged = privileged
        self.inits = 0
        self.writes: list[str] = []
        self.faults: dict[int, int] = {}
        self.t0 = time.monotonic()
        self._handles: dict[int, tuple[Any, ...]] = {}
        self._next_addr = 0x10000

    # installation ----------------------------------------------------------
    def install(self, monkeypatch: Any) -> None:
        """Make pynvml call this driver (pytest's monkeypatch undoes it)."""
        import pynvml

        monkeypatch.setattr(pynvml, "nvmlLib", self)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", self.lookup)
        monkeypatch.setattr(
            pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string)
        )

    def lookup(self, name: str) -> Any:
        """pynvml's ``_nvmlGetFunctionPointer``: the fake C function called ``name``."""
        import pynvml

        fn = getattr(self, name, None) if name.startswith("nvml") else None
        if fn is None:
            raise pynvml.NVMLError(ERROR_FUNCTION_NOT_FOUND)

        def call(*args: Any) -> Any:  # a plain function: pynvml may set ``restype`` on it
            if name in WRITES:
                k = len(self.writes)
                self.writes.append(name)
                if k in self.faults:
                    return self.faults.pop(k)
                if not self.privileged:
                    return ERROR_NO_PERMISSION
            return fn(*args)

        return call

    def fail_write(self, k: int, code: int = ERROR_NO_PERMISSION) -> None:
        """The k-th write call from now returns ``code`` and changes nothing."""
        self.faults[len(self.writes) + k] = code

    # state -----------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Every setting of every GPU, for exact before/after comparisons."""
        return [
            {
                "persistence": g.persistence,
                "locked": g.locked,
                "power_limit_mw": g.power_limit_mw,
                "mig": (g.mig_current, g.mig_pending),
                "gis": sorted(
                    (gi.profile, gi.start, gi.size, tuple(sorted(gi.cis.values())))
                    for gi in g.gis.values()
                ),
            }
            for g in self.gpus
        ]

    def make_instance(self, index: int, enum: int, start: int) -> None:
        """Create a GPU instance with one full compute instance, as another tool would."""
        gpu = self.gpus[index]
        pid, slices, size, _, _ = GI_PROFILES[enum]
        gi_id = min(set(range(1, 15)) - set(gpu.gis))
        ci_enum = min(k for k, v in CI_SLICES.items() if v == slices)
        gpu.gis[gi_id] = FakeGi(gi_id, pid, start, size, slices, {0: ci_enum})

    def _new_handle(self, *what: Any) -> int:
        for addr, known in self._handles.items():
            if known == what:
                return addr
        self._next_addr += 0x10
        self._handles[self._next_addr] = what
        return self._next_addr

    def _device(self, handle: Any) -> FakeGpu | None:
        what = self._handles.get(_addr(handle))
        return self.gpus[what[1]] if what and what[0] == "dev" else None

    def _gi(self, handle: Any) -> tuple[FakeGpu, FakeGi] | None:
        what = self._handles.get(_addr(handle))
        if not what or what[0] != "gi":
            return None
        gpu = self.gpus[what[1]]
        gi = gpu.gis.get(what[2])
        return (gpu, gi) if gi is not None else None

    def _profile(
        self, gpu: FakeGpu, pid: int
    ) -> tuple[int, int, int, tuple[int, ...], bool] | None:
        if not gpu.mig_capable:
            return None
        return next((p for p in GI_PROFILES.values() if p[0] == pid), None)

    def _name(self, gpu: FakeGpu, pid: int) -> str:
        _, slices, size, _, me = next(p for p in GI_PROFILES.values() if p[0] == pid)
        gb = round(gpu.gtype.memory_gb * size / 8)
        total = gpu.gtype.memory_gb
        nominal = {1: 10, 2: 20, 4: 40, 8: 80} if total == 80 else {1: 18, 2: 35, 4: 71, 8: 141}
        gb = nominal.get(size, gb)
        return f"{slices}g.{gb}gb" + ("+me" if me else "")

    # C functions: library ----------------------------------------------------
    def nvmlInitWithFlags(self, flags: Any) -> int:
        self.inits += 1
        return SUCCESS

    def nvmlShutdown(self) -> int:
        if self.inits == 0:
            return ERROR_UNINITIALIZED
        self.inits -= 1
        return SUCCESS

    def nvmlErrorString(self, code: Any) -> bytes:
        return f"fake NVML error {_val(code)}".encode()

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        if not self.inits:
            return ERROR_UNINITIALIZED
        _obj(count).value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        i = _val(index)
        if not self.inits:
            return ERROR_UNINITIALIZED
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        _put_pointer(device, self._new_handle("dev", i))
        return SUCCESS

    def _string(self, handle: Any, buf: Any, length: Any, which: str) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        text = (nvml_name(gpu.gtype.name) if which == "name" else gpu.uuid).encode()
        if len(text) + 1 > _val(length):
            return ERROR_INSUFFICIENT_SIZE
        buf.value = text
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> int:
        return self._string(handle, buf, length, "name")

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> int:
        return self._string(handle, buf, length, "uuid")

    # C functions: settings ---------------------------------------------------
    def nvmlDeviceGetPersistenceMode(self, handle: Any, mode: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        _obj(mode).value = int(gpu.persistence)
        return SUCCESS

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: Any) -> int:
        gpu = self._device(handle)
        if gpu is None or _val(mode) not in (0, 1):
            return ERROR_INVALID_ARGUMENT
        gpu.persistence = bool(_val(mode))
        return SUCCESS

    def _fill(self, values: list[int], count: Any, array: Any) -> int:
        n = _obj(count)
        if array is None or n.value < len(values):
            n.value = len(values)
            return ERROR_INSUFFICIENT_SIZE
        for i, v in enumerate(values):
            array[i] = v
        n.value = len(values)
        return SUCCESS

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any, count: Any, clocks: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        return self._fill([MEMORY_CLOCK_MHZ.get(gpu.gtype.name, 5001)], count, clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, handle: Any, mem: Any, count: Any, clocks: Any
    ) -> int:
        gpu = self._device(handle)
        if gpu is None or _val(mem) != MEMORY_CLOCK_MHZ.get(gpu.gtype.name, 5001):
            return ERROR_INVALID_ARGUMENT if gpu is None else ERROR_NOT_FOUND
        return self._fill(sorted(gpu.gtype.sm_clocks_mhz(), reverse=True), count, clocks)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, lo: Any, hi: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if not gpu.clocks_supported:
            return ERROR_NOT_SUPPORTED
        g = gpu.gtype
        if not g.min_sm_clock_mhz <= _val(lo) <= _val(hi) <= g.max_sm_clock_mhz:
            return ERROR_INVALID_ARGUMENT
        gpu.locked = (_val(lo), _val(hi))
        return SUCCESS

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if not gpu.clocks_supported:
            return ERROR_NOT_SUPPORTED
        gpu.locked = None
        return SUCCESS

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        _obj(limit).value = gpu.power_limit_mw
        return SUCCESS

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, lo: Any, hi: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        _obj(lo).value = round(gpu.gtype.power_limit_min_w * 1000)
        _obj(hi).value = round(gpu.gtype.power_limit_max_w * 1000)
        return SUCCESS

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        g = gpu.gtype
        if not g.power_limit_min_w * 1000 <= _val(limit) <= g.power_limit_max_w * 1000:
            return ERROR_INVALID_ARGUMENT
        gpu.power_limit_mw = _val(limit)
        return SUCCESS

    def _power_mw(self, gpu: FakeGpu) -> int:
        return round(min(gpu.gtype.idle_w, gpu.power_limit_mw / 1000) * 1000)

    def nvmlDeviceGetPowerUsage(self, handle: Any, power: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        _obj(power).value = self._power_mw(gpu)
        return SUCCESS

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, energy: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        _obj(energy).value = int(self._power_mw(gpu) * (time.monotonic() - self.t0)) + 10**9
        return SUCCESS

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, clock: Any) -> int:
        gpu = self._device(handle)
        if gpu is None or _val(kind) not in (0, 1, 2):
            return ERROR_INVALID_ARGUMENT
        sm = gpu.locked[1] if gpu.locked else gpu.gtype.min_sm_clock_mhz
        _obj(clock).value = sm if _val(kind) != 2 else MEMORY_CLOCK_MHZ.get(gpu.gtype.name, 5001)
        return SUCCESS

    # C functions: MIG --------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if not gpu.mig_capable:
            return ERROR_NOT_SUPPORTED
        _obj(current).value = gpu.mig_current
        _obj(pending).value = gpu.mig_pending
        return SUCCESS

    def nvmlDeviceSetMigMode(self, handle: Any, mode: Any, status: Any) -> int:
        gpu = self._device(handle)
        if gpu is None or _val(mode) not in (0, 1):
            return ERROR_INVALID_ARGUMENT
        if not gpu.mig_capable:
            return ERROR_NOT_SUPPORTED
        if gpu.gis and _val(mode) == 0:
            return ERROR_IN_USE
        gpu.mig_pending = _val(mode)
        if gpu.mig_needs_reset and gpu.mig_pending != gpu.mig_current:
            _obj(status).value = ERROR_RESET_REQUIRED
        else:
            gpu.mig_current = gpu.mig_pending
            _obj(status).value = SUCCESS
        return SUCCESS

    def _gi_info(self, handle: Any, enum: Any, info: Any, version: int | None) -> int:
        gpu = self._device(handle)
        if gpu is None or not 0 <= _val(enum) < GI_PROFILE_COUNT:
            return ERROR_INVALID_ARGUMENT
        out = _obj(info)
        if version is not None and out.version != version:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        prof = GI_PROFILES.get(_val(enum)) if gpu.mig_capable else None
        if prof is None or not gpu.mig_current:  # the stricter drivers: none while MIG is off
            return ERROR_NOT_SUPPORTED
        pid, slices, size, starts, me = prof
        out.id = pid
        out.sliceCount = slices
        out.instanceCount = 1 if me else len(starts)
        out.multiprocessorCount = gpu.gtype.sm_count * slices // 7
        out.memorySizeMB = int(gpu.gtype.memory_gb * 1000 * size / 8 * 0.95)
        if version is not None:
            out.name = f"MIG {self._name(gpu, pid)}".encode()
        return SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, enum: Any, info: Any) -> int:
        return self._gi_info(handle, enum, info, GI_INFO_V2)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: Any, info: Any) -> int:
        return self._gi_info(handle, enum, info, None)

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, pid: Any, placements: Any, count: Any
    ) -> int:
        gpu = self._device(handle)
        prof = self._profile(gpu, _val(pid)) if gpu else None
        if prof is None:
            return ERROR_INVALID_ARGUMENT if gpu is None else ERROR_NOT_SUPPORTED
        _, _, size, starts, _ = prof
        n = _obj(count)  # output only (nvml.h); the array must hold every placement
        n.value = len(starts)
        if placements is None:
            return SUCCESS
        for i, s in enumerate(starts):
            placements[i].start = s
            placements[i].size = size
        n.value = len(starts)
        return SUCCESS

    def _create(self, gpu: FakeGpu, pid: int, start: int | None, size: int | None) -> int:
        """Create a GPU instance; its id, or an error code as a negative number."""
        prof = self._profile(gpu, pid)
        if prof is None:
            return -ERROR_INVALID_ARGUMENT
        if not gpu.mig_current:
            return -ERROR_NOT_SUPPORTED
        _, slices, psize, starts, me = prof
        mine = [gi for gi in gpu.gis.values() if gi.profile == pid]
        if len(mine) >= (1 if me else len(starts)):
            return -ERROR_INSUFFICIENT_RESOURCES
        used = {s for gi in gpu.gis.values() for s in range(gi.start, gi.start + gi.size)}
        free = [s for s in starts if not used & set(range(s, s + psize))]
        if start is None:
            if not free:
                return -ERROR_INSUFFICIENT_RESOURCES
            start = max(free)  # the driver fills from the top when it chooses
        elif start not in starts or size != psize:
            return -ERROR_INVALID_ARGUMENT
        elif start not in free:
            return -ERROR_INSUFFICIENT_RESOURCES
        gi_id = min(set(range(1, 15)) - set(gpu.gis))
        gpu.gis[gi_id] = FakeGi(gi_id, pid, start, psize, slices)
        return gi_id

    def _put_gi(self, gpu: FakeGpu, gi_id: int, ref: Any) -> None:
        _put_pointer(ref, self._new_handle("gi", self.gpus.index(gpu), gi_id))

    def nvmlDeviceCreateGpuInstance(self, handle: Any, pid: Any, gi: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        made = self._create(gpu, _val(pid), None, None)
        if made < 0:
            return -made
        self._put_gi(gpu, made, gi)
        return SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, pid: Any, placement: Any, gi: Any
    ) -> int:
        gpu = self._device(handle)
        if gpu is None or placement is None:
            return ERROR_INVALID_ARGUMENT
        place = _obj(placement)
        made = self._create(gpu, _val(pid), int(place.start), int(place.size))
        if made < 0:
            return -made
        self._put_gi(gpu, made, gi)
        return SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle: Any, pid: Any, gis: Any, count: Any) -> int:
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if self._profile(gpu, _val(pid)) is None:
            return ERROR_INVALID_ARGUMENT
        if not gpu.mig_current:
            return ERROR_NOT_SUPPORTED
        found = sorted(gi.id for gi in gpu.gis.values() if gi.profile == _val(pid))
        n = _obj(count)  # output only: the array holds the profile's instanceCount
        n.value = len(found)
        if gis is None:
            return ERROR_INVALID_ARGUMENT
        for i, gi_id in enumerate(found):
            addr = self._new_handle("gi", self.gpus.index(gpu), gi_id)
            gis[i] = ctypes.cast(ctypes.c_void_p(addr), gis._type_)
        n.value = len(found)
        return SUCCESS

    def nvmlGpuInstanceGetInfo(self, gi: Any, info: Any) -> int:
        found = self._gi(gi)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        gpu, inst = found
        out = _obj(info)
        dev = self._new_handle("dev", self.gpus.index(gpu))
        out.device = ctypes.cast(ctypes.c_void_p(dev), type(out.device))
        out.id = inst.id
        out.profileId = inst.profile
        out.placement.start = inst.start
        out.placement.size = inst.size
        return SUCCESS

    def _ci_info(self, gi: Any, enum: Any, eng: Any, info: Any, version: int | None) -> int:
        found = self._gi(gi)
        if found is None or _val(eng) != 0 or _val(enum) not in CI_SLICES:
            return ERROR_INVALID_ARGUMENT
        _, inst = found
        out = _obj(info)
        if version is not None and out.version != version:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        slices = CI_SLICES[_val(enum)]
        if slices > inst.slices:
            return ERROR_NOT_SUPPORTED
        out.id = _val(enum)
        out.sliceCount = slices
        out.instanceCount = inst.slices // slices
        return SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gi: Any, enum: Any, eng: Any, info: Any
    ) -> int:
        return self._ci_info(gi, enum, eng, info, CI_INFO_V2)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: Any, enum: Any, eng: Any, info: Any
    ) -> int:
        return self._ci_info(gi, enum, eng, info, None)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, pid: Any, ci: Any) -> int:
        found = self._gi(gi)
        if found is None or _val(pid) not in CI_SLICES:
            return ERROR_INVALID_ARGUMENT
        gpu, inst = found
        used = sum(CI_SLICES[p] for p in inst.cis.values())
        if used + CI_SLICES[_val(pid)] > inst.slices:
            return ERROR_INSUFFICIENT_RESOURCES
        ci_id = min(set(range(0, 8)) - set(inst.cis))
        inst.cis[ci_id] = _val(pid)
        _put_pointer(ci, self._new_handle("ci", self.gpus.index(gpu), inst.id, ci_id))
        return SUCCESS

    def nvmlGpuInstanceGetComputeInstances(self, gi: Any, pid: Any, cis: Any, count: Any) -> int:
        found = self._gi(gi)
        if found is None or _val(pid) not in CI_SLICES:
            return ERROR_INVALID_ARGUMENT
        gpu, inst = found
        mine = sorted(c for c, p in inst.cis.items() if p == _val(pid))
        n = _obj(count)  # output only: the array holds the profile's instanceCount
        n.value = len(mine)
        if cis is None:
            return ERROR_INVALID_ARGUMENT
        for i, ci_id in enumerate(mine):
            addr = self._new_handle("ci", self.gpus.index(gpu), inst.id, ci_id)
            cis[i] = ctypes.cast(ctypes.c_void_p(addr), cis._type_)
        n.value = len(mine)
        return SUCCESS

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        what = self._handles.get(_addr(ci))
        if not what or what[0] != "ci":
            return ERROR_INVALID_ARGUMENT
        inst = self.gpus[what[1]].gis.get(what[2])
        if inst is None or what[3] not in inst.cis:
            return ERROR_INVALID_ARGUMENT
        del inst.cis[what[3]]
        return SUCCESS

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        found = self._gi(gi)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        gpu, inst = found
        if inst.cis:
            return ERROR_IN_USE
        del gpu.gis[inst.id]
        return SUCCESS


FAKE_MPS_CONTROL = '''#!{python}
"""A fake nvidia-cuda-mps-control: one JSON file per daemon under its pipe directory."""
import json, os, pathlib, sys

counter = os.environ.get("FAKE_MPS_COUNTER")
if counter:  # fault injection: the call numbered FAKE_MPS_FAIL_AT (0-based) is refused
    path = pathlib.Path(counter)
    calls = int(path.read_text()) if path.exists() else 0
    path.write_text(str(calls + 1))
    if str(calls) == os.environ.get("FAKE_MPS_FAIL_AT"):
        sys.exit("refused by the test (injected fault)")
pipe = pathlib.Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
state = pipe / "control"
if sys.argv[1:] == ["-d"]:
    if state.exists():
        sys.exit("An instance of this daemon is already running")
    pipe.mkdir(parents=True, exist_ok=True)
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    state.write_text(json.dumps({{"default_pct": 100, "device": device}}))
    sys.exit(0)
if not state.exists():
    sys.exit("Cannot find MPS control daemon process")
data = json.loads(state.read_text())
for line in sys.stdin.read().splitlines():
    cmd = line.split()
    if cmd == ["quit"]:
        state.unlink()
    elif cmd[:1] == ["get_default_active_thread_percentage"]:
        print(f"{{float(data['default_pct']):.1f}}")
    elif cmd[:1] == ["set_default_active_thread_percentage"]:
        data["default_pct"] = int(cmd[1])
        state.write_text(json.dumps(data))
        print(cmd[1])
    else:
        sys.exit(f"unknown command {{line}}")
'''


def mps_state(base: Any) -> dict[str, Any]:
    """Every fake MPS daemon under ``base``: pipe directory -> its state."""
    import json
    from pathlib import Path

    return {
        str(p.parent): json.loads(p.read_text()) for p in sorted(Path(base).glob("*/pipe/control"))
    }
