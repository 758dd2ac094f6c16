"""Executor: put a plan onto the GPUs of this host through NVML, safely.

See docs/executor.md. ``pynvml`` is imported only when the real backend is opened.
"""

from energyopt.nvml.actions import (
    Action,
    ConfigureMig,
    ConfigureMps,
    Ctx,
    LockClocks,
    SetPersistence,
    SetPowerLimit,
)
from energyopt.nvml.backend import Backend, MpsControl
from energyopt.nvml.errors import ApplyFailed, ApplyInterrupted, ExecutorError
from energyopt.nvml.planner import HostPlan, mig_parted_yaml, plan_actions
from energyopt.nvml.sim import SimClock, SimMps, SimulatedNvml
from energyopt.nvml.transaction import Transaction, restore

__all__ = [
    "Action",
    "ApplyFailed",
    "ApplyInterrupted",
    "Backend",
    "ConfigureMig",
    "ConfigureMps",
    "Ctx",
    "ExecutorError",
    "HostPlan",
    "LockClocks",
    "MpsControl",
    "SetPersistence",
    "SetPowerLimit",
    "SimClock",
    "SimMps",
    "SimulatedNvml",
    "Transaction",
    "mig_parted_yaml",
    "plan_actions",
    "restore",
]
