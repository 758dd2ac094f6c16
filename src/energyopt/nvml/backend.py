"""The NVML interface the executor uses; devices are addressed by NVML index.

Units: clocks in MHz, power in mW, energy in mJ (as NVML reports them).
"""

from __future__ import annotations

from typing import Literal, Protocol

#: The locked SM clock range ``(min_mhz, max_mhz)``, ``None`` when unlocked, or
#: ``"unknown"`` where NVML cannot say (it has no getter for locked clocks).
LockedClocks = tuple[int, int] | None | Literal["unknown"]

#: A MIG GPU instance: (profile name such as ``3g.40gb``, start memory slice).
MigInstance = tuple[str, int]


class Backend(Protocol):
    """What the executor needs from NVML. Writes raise typed ``ExecutorError``s."""

    kind: str

    def device_count(self) -> int:
        """Number of GPUs visible to NVML."""
        ...

    def index_of_uuid(self, uuid: str) -> int:
        """NVML index of the GPU with ``uuid``; DeviceMapError if there is none."""
        ...

    def name(self, index: int) -> str:
        """Product name as NVML reports it (for example ``NVIDIA A100-SXM4-80GB``)."""
        ...

    def uuid(self, index: int) -> str:
        """Stable device UUID (``GPU-...``)."""
        ...

    def get_persistence(self, index: int) -> bool:
        """Persistence mode."""
        ...

    def set_persistence(self, index: int, enabled: bool) -> None:
        """Set persistence mode (needs root)."""
        ...

    def supported_sm_clocks(self, index: int) -> tuple[int, ...]:
        """SM clocks the device accepts at its highest memory clock, ascending (MHz)."""
        ...

    def get_locked_clocks(self, index: int) -> LockedClocks:
        """Locked SM clock range (MHz), None when unlocked, "unknown" when unreadable."""
        ...

    def set_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """Lock SM clocks to ``[min_mhz, max_mhz]`` (needs root)."""
        ...

    def reset_locked_clocks(self, index: int) -> None:
        """Unlock SM clocks (driver default behaviour)."""
        ...

    def get_power_limit(self, index: int) -> int:
        """Current power management limit (mW)."""
        ...

    def get_power_limit_constraints(self, index: int) -> tuple[int, int]:
        """Allowed power limit range ``(min_mw, max_mw)``."""
        ...

    def set_power_limit(self, index: int, limit_mw: int) -> None:
        """Set the power management limit (mW, needs root)."""
        ...

    def get_power_usage(self, index: int) -> int:
        """Current board power draw (mW)."""
        ...

    def get_total_energy(self, index: int) -> int:
        """Energy counter since the driver was loaded (mJ)."""
        ...

    def get_sm_clock(self, index: int) -> int:
        """Current SM clock (MHz)."""
        ...

    def mig_supported(self, index: int) -> bool:
        """Whether the GPU supports MIG at all."""
        ...

    def get_mig_mode(self, index: int) -> bool:
        """Current MIG mode (True: enabled)."""
        ...

    def get_mig_pending(self, index: int) -> bool:
        """MIG mode after the next GPU reset (equal to the current mode when none is pending)."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Enable or disable MIG; raises if the change needs a GPU reset that did not happen."""
        ...

    def list_gpu_instances(self, index: int) -> tuple[MigInstance, ...]:
        """The existing GPU instances as (profile name, start memory slice), sorted."""
        ...

    def create_gpu_instance(self, index: int, profile: str, start: int | None = None) -> None:
        """Create a GPU instance of ``profile`` at memory slice ``start`` (None: the
        driver's choice) and one compute instance filling it."""
        ...

    def destroy_gpu_instances(self, index: int) -> None:
        """Destroy every compute and GPU instance of the GPU (newest first)."""
        ...


class MpsControl(Protocol):
    """Control of an MPS control daemon, one per GPU, addressed by its pipe directory."""

    def is_running(self, pipe_dir: str) -> bool:
        """Whether a control daemon answers on ``pipe_dir``."""
        ...

    def start(self, pipe_dir: str, log_dir: str, device_uuid: str) -> None:
        """Start a control daemon for the GPU ``device_uuid``."""
        ...

    def stop(self, pipe_dir: str) -> None:
        """Quit the control daemon (and its servers)."""
        ...

    def get_default_percentage(self, pipe_dir: str) -> int:
        """Default active-thread percentage of new MPS servers (%)."""
        ...

    def set_default_percentage(self, pipe_dir: str, pct: int) -> None:
        """Set the default active-thread percentage of new MPS servers (%)."""
        ...


class Clock(Protocol):
    """Time source for measurements (real, or simulated time for tests)."""

    def now(self) -> float:
        """Seconds, monotonic."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...
