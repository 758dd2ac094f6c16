"""Compile spec: which instance to tabulate, on which grid, with which solver."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.io import load


class CompileSpec(Spec):
    """A ``energyopt compile`` input file (YAML, JSON or TOML)."""

    kind: Literal["plans", "oppoints"] = Field(
        description="plans: solve every grid cell; oppoints: performance model only"
    )
    base: str = Field(description="instance file, relative to the spec file")
    # kind plans
    load_scale: tuple[float, ...] = Field(
        default=(1.0,), description="multipliers of every workload's rate (ascending)"
    )
    workload_scale: dict[str, tuple[float, ...]] = Field(
        default_factory=dict, description="extra per-workload rate multipliers (ascending)"
    )
    solver: str = Field(default="highs-exact", description="solver preset name or TOML file")
    time_limit_s: float | None = Field(default=None, gt=0, description="per cell, seconds")
    rel_gap: float | None = Field(default=None, ge=0, lt=1)
    # kind oppoints
    load_points: int = Field(default=65, ge=2, le=100_000, description="load grid points")
    load_max_rps: float | None = Field(default=None, gt=0, description="top of the load grid")

    @model_validator(mode="after")
    def _check(self) -> CompileSpec:
        grids = {"load_scale": self.load_scale} | {
            f"workload_scale.{k}": v for k, v in self.workload_scale.items()
        }
        for name, values in grids.items():
            if not values:
                raise ValueError(f"{name} is empty")
            if any(v <= 0 for v in values):
                raise ValueError(f"{name}: scales must be positive")
            if list(values) != sorted(set(values)):
                raise ValueError(f"{name}: values must be strictly ascending")
        return self


def load_compile_spec(path: str | Path) -> tuple[CompileSpec, Path]:
    """The spec and the resolved path of its base instance."""
    p = Path(path)
    spec = load(CompileSpec, p)
    base = Path(spec.base)
    if not base.is_absolute():
        base = p.parent / base
    return spec, base
