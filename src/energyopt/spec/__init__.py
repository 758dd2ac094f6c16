"""Pydantic schemas of every input and output, and their file I/O.

The names below are imported on first use (PEP 562): importing one submodule, such
as ``energyopt.spec.errors``, does not build every schema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from energyopt.spec.cluster import (
        Cluster,
        CurrentPlacement,
        Gpu,
        GpuEntry,
        GpuState,
        Link,
        Node,
    )
    from energyopt.spec.errors import SpecError
    from energyopt.spec.hardware import Efficiency, GpuType, MigProfile, PowerParams
    from energyopt.spec.instance import Instance, Objective, Options, Sharing
    from energyopt.spec.io import dump, dumps_json, load, parse, read_data
    from energyopt.spec.llm import LlmModel
    from energyopt.spec.plan import GpuPlan, Placement, Plan
    from energyopt.spec.workload import Phase, Slo, TokenDist, Workload

_HOME: dict[str, str] = {
    "Cluster": "energyopt.spec.cluster",
    "CurrentPlacement": "energyopt.spec.cluster",
    "Gpu": "energyopt.spec.cluster",
    "GpuEntry": "energyopt.spec.cluster",
    "GpuState": "energyopt.spec.cluster",
    "Link": "energyopt.spec.cluster",
    "Node": "energyopt.spec.cluster",
    "SpecError": "energyopt.spec.errors",
    "Efficiency": "energyopt.spec.hardware",
    "GpuType": "energyopt.spec.hardware",
    "MigProfile": "energyopt.spec.hardware",
    "PowerParams": "energyopt.spec.hardware",
    "Instance": "energyopt.spec.instance",
    "Objective": "energyopt.spec.instance",
    "Options": "energyopt.spec.instance",
    "Sharing": "energyopt.spec.instance",
    "dump": "energyopt.spec.io",
    "dumps_json": "energyopt.spec.io",
    "load": "energyopt.spec.io",
    "parse": "energyopt.spec.io",
    "read_data": "energyopt.spec.io",
    "LlmModel": "energyopt.spec.llm",
    "GpuPlan": "energyopt.spec.plan",
    "Placement": "energyopt.spec.plan",
    "Plan": "energyopt.spec.plan",
    "Phase": "energyopt.spec.workload",
    "Slo": "energyopt.spec.workload",
    "TokenDist": "energyopt.spec.workload",
    "Workload": "energyopt.spec.workload",
}
"""Each exported name -> the submodule that defines it."""


def __getattr__(name: str) -> Any:
    """An exported name, or a submodule, imported on first use (PEP 562)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = [
    "Cluster",
    "CurrentPlacement",
    "Efficiency",
    "Gpu",
    "GpuEntry",
    "GpuPlan",
    "GpuState",
    "GpuType",
    "Instance",
    "Link",
    "LlmModel",
    "MigProfile",
    "Node",
    "Objective",
    "Options",
    "Phase",
    "Placement",
    "Plan",
    "PowerParams",
    "Sharing",
    "Slo",
    "SpecError",
    "TokenDist",
    "Workload",
    "dump",
    "dumps_json",
    "load",
    "parse",
    "read_data",
]
