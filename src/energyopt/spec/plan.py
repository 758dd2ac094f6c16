"""Plan: the decision for every GPU, as solvers return it and the executor applies it."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from pydantic import Field, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.workload import Phase


class Placement(Spec):
    """One unit (a workload, or one phase of it) served on one GPU."""

    workload: str = Field(min_length=1)
    phase: Phase = "both"
    share_pct: int = Field(default=100, gt=0, le=100, description="MPS percentage of SMs")
    mig_profile: str | None = Field(
        default=None, min_length=1, description="MIG profile, in MIG mode"
    )
    rate_rps: float = Field(ge=0, le=1e6, description="requests per second routed here")
    tp_group: str | None = Field(
        default=None, description="tensor-parallel group id; the rate is the group's"
    )
    tp_size: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _check(self) -> Placement:
        if self.mig_profile is not None and self.share_pct != 100:
            raise ValueError(
                f"a MIG instance ({self.mig_profile}) has all of its SMs; share_pct "
                f"{self.share_pct} is for MPS placements"
            )
        return self


class GpuPlan(Spec):
    """Setting of one GPU."""

    gpu: str = Field(min_length=1, description="GPU id as the cluster names it")
    type: str = Field(min_length=1, description="catalog GPU type")
    on: bool
    clock_mhz: int | None = Field(default=None, gt=0, le=10_000)
    power_limit_w: float | None = Field(default=None, gt=0, le=10_000)
    placements: tuple[Placement, ...] = ()
    predicted_power_w: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> GpuPlan:
        mig = any(p.mig_profile is not None for p in self.placements)
        if mig and any(p.share_pct < 100 for p in self.placements):
            raise ValueError(
                "placements mix MIG profiles and MPS shares; a GPU is in one mode or the other"
            )
        return self


class Plan(Spec):
    """A fleet plan with the solver's account of its quality."""

    UNCHECKED_NUMBERS: ClassVar[frozenset[str]] = frozenset({"objective", "bound", "gap"})

    instance: str
    gpus: tuple[GpuPlan, ...]
    objective: float | None = Field(default=None, allow_inf_nan=True)
    bound: float | None = Field(default=None, allow_inf_nan=True)
    gap: float | None = Field(default=None, allow_inf_nan=True)
    solver: str = ""
    status: str = ""

    @model_validator(mode="after")
    def _check(self) -> Plan:
        ids = Counter(g.gpu for g in self.gpus)
        dup = sorted(i for i, k in ids.items() if k > 1)
        if dup:
            raise ValueError(f"GPU {dup[0]!r} has more than one entry")
        return self

    def gpu(self, gpu_id: str) -> GpuPlan:
        """The plan of GPU ``gpu_id``."""
        for g in self.gpus:
            if g.gpu == gpu_id:
                return g
        raise KeyError(gpu_id)

    def uses_mig(self) -> bool:
        """True if any placement names a MIG profile."""
        return any(p.mig_profile for g in self.gpus for p in g.placements)
