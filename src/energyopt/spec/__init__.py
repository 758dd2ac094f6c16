"""Pydantic schemas of every input and output, and their file I/O."""

from energyopt.spec.cluster import Cluster, CurrentPlacement, Gpu, GpuEntry, GpuState, Link, Node
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import Efficiency, GpuType, MigProfile, PowerParams
from energyopt.spec.instance import Instance, Objective, Options, Sharing
from energyopt.spec.io import dump, dumps_json, load, parse, read_data
from energyopt.spec.llm import LlmModel
from energyopt.spec.plan import GpuPlan, Placement, Plan
from energyopt.spec.workload import Phase, Slo, TokenDist, Workload

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
