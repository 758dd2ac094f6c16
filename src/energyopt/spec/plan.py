"""Plan: the decision for every GPU, as solvers return it and the executor applies it."""

from __future__ import annotations

from pydantic import Field

from energyopt.spec.base import Spec
from energyopt.spec.workload import Phase


class Placement(Spec):
    """One unit (a workload, or one phase of it) served on one GPU."""

    workload: str
    phase: Phase = "both"
    share_pct: int = Field(default=100, gt=0, le=100, description="MPS percentage of SMs")
    mig_profile: str | None = Field(default=None, description="MIG profile, in MIG mode")
    rate_rps: float = Field(ge=0, description="requests per second routed here")
    tp_group: str | None = Field(
        default=None, description="tensor-parallel group id; the rate is the group's"
    )
    tp_size: int = Field(default=1, ge=1)


class GpuPlan(Spec):
    """Setting of one GPU."""

    gpu: str = Field(description="GPU id as the cluster names it")
    type: str
    on: bool
    clock_mhz: int | None = None
    power_limit_w: float | None = None
    placements: tuple[Placement, ...] = ()
    predicted_power_w: float = Field(default=0.0, ge=0)


class Plan(Spec):
    """A fleet plan with the solver's account of its quality."""

    instance: str
    gpus: tuple[GpuPlan, ...]
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    solver: str = ""
    status: str = ""

    def gpu(self, gpu_id: str) -> GpuPlan:
        """The plan of GPU ``gpu_id``."""
        for g in self.gpus:
            if g.gpu == gpu_id:
                return g
        raise KeyError(gpu_id)
