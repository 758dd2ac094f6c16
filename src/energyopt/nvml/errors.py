"""Typed executor errors. Each message says what failed and what the user can do."""

from __future__ import annotations

from energyopt.spec.errors import NvmlError


class ExecutorError(NvmlError):
    """Base of every executor error; ``str(exc)`` is a message for the user."""


class BackendUnavailable(ExecutorError):
    """No NVML: nvidia-ml-py is missing, the driver is absent, or no GPU is visible."""


class NoPermission(ExecutorError):
    """The driver refused a write for lack of privileges."""

    def __init__(self, gpu: str, setting: str) -> None:
        super().__init__(
            f"{gpu}: no permission to change {setting}: run as root or grant the process "
            "CAP_SYS_ADMIN (for example a systemd unit with AmbientCapabilities=CAP_SYS_ADMIN; "
            "see docs/executor.md)"
        )
        self.gpu = gpu
        self.setting = setting


class NotSupported(ExecutorError):
    """The device does not support a setting."""

    def __init__(self, gpu: str, setting: str, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{gpu}: {setting} is not supported on this GPU{extra}")
        self.gpu = gpu
        self.setting = setting


class ClockNotSupported(ExecutorError):
    """A requested SM clock is not in the device's supported list."""

    def __init__(self, gpu: str, clock_mhz: int, nearest: tuple[int, ...]) -> None:
        near = ", ".join(f"{c} MHz" for c in nearest)
        super().__init__(
            f"{gpu}: SM clock {clock_mhz} MHz is not supported; nearest supported clocks: "
            f"{near} (nvidia-smi -q -d SUPPORTED_CLOCKS lists them all)"
        )
        self.gpu = gpu
        self.clock_mhz = clock_mhz
        self.nearest = nearest


class PowerLimitOutOfRange(ExecutorError):
    """A requested power limit lies outside the device's constraints."""

    def __init__(self, gpu: str, limit_mw: int, min_mw: int, max_mw: int) -> None:
        super().__init__(
            f"{gpu}: power limit {limit_mw / 1000:g} W is outside the device's range "
            f"[{min_mw / 1000:g}, {max_mw / 1000:g}] W; re-solve with this range or fix the plan"
        )
        self.gpu = gpu
        self.limit_mw = limit_mw


class MigLayoutError(ExecutorError):
    """A MIG layout does not fit the GPU (slices, instance counts or unknown profile)."""


class DeviceMapError(ExecutorError):
    """Plan GPUs cannot be matched to the devices of this host."""


class VerifyFailed(ExecutorError):
    """A setting read back differs from what was written."""


class NvmlCallFailed(ExecutorError):
    """Any other NVML failure, with the call and the driver's message."""


class MpsError(ExecutorError):
    """The MPS control daemon could not be started, configured or stopped."""


class CheckpointError(ExecutorError):
    """The checkpoint file could not be written or read."""


class BadCheckpoint(CheckpointError):
    """The checkpoint file is missing, unreadable, or not a well-formed checkpoint: bad
    input (the command line's exit status 2), not a GPU error."""


class ApplyFailed(ExecutorError):
    """An apply failed (or was interrupted) and what it changed was rolled back."""

    def __init__(self, cause: BaseException, restore_errors: list[str]) -> None:
        if restore_errors:
            tail = (
                "; RESTORE INCOMPLETE, fix by hand or with `energyopt restore CHECKPOINT`:\n  "
                + "\n  ".join(restore_errors)
            )
        else:
            tail = "; every setting it changed was restored"
        super().__init__(f"apply failed: {describe_cause(cause)}{tail}")
        self.cause = cause
        self.restore_errors = restore_errors

    @property
    def restored(self) -> bool:
        """True when every changed setting was put back."""
        return not self.restore_errors


class ApplyInterrupted(ApplyFailed):
    """The apply was stopped by SIGINT or SIGTERM and rolled back."""


class Interrupted(BaseException):
    """Raised from a signal handler (SIGTERM, SIGINT) inside a transaction."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def describe_cause(cause: BaseException) -> str:
    """A one-line account of why an apply stopped."""
    if isinstance(cause, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if isinstance(cause, Interrupted):
        return f"interrupted (signal {cause.signum})"
    if isinstance(cause, ExecutorError):
        return str(cause)
    return f"{type(cause).__name__}: {cause}"
