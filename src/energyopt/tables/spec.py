"""Compile spec: which instance to tabulate, on which grid, with which solver."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from energyopt.catalog.problem import Problem, load_problem
from energyopt.spec.base import Spec
from energyopt.spec.errors import SpecError
from energyopt.spec.io import load
from energyopt.spec.limits import over_limit


def _no_duplicates(names: list[str]) -> None:
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate names {dup}")


class SloTier(Spec):
    """A named SLO tier: every workload's TTFT and TBT SLO times a multiplier."""

    name: str = Field(min_length=1, description="the key of the slo_tier axis")
    ttft_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="x TTFT SLO")
    tbt_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="x TBT SLO")


class CompileSpec(Spec):
    """A ``energyopt compile`` input file (YAML, JSON or TOML)."""

    kind: Literal["plans", "oppoints"] = Field(
        description="plans: solve every grid cell; oppoints: performance model only"
    )
    base: str = Field(description="instance file, relative to the spec file")
    slo_tiers: tuple[SloTier, ...] = Field(
        default=(), description="SLO tiers (axis slo_tier); none: the base SLOs, no axis"
    )
    gpu_types: tuple[str, ...] = Field(
        default=(),
        description=(
            "GPU types (axis gpu_type of a plan table: every GPU of the base fleet is "
            "of that type; of an oppoints table: the types tabulated); none: the base fleet's"
        ),
    )
    # kind plans
    load_scale: tuple[float, ...] = Field(
        default=(1.0,), description="multipliers of every workload's rate (ascending)"
    )
    workload_scale: dict[str, tuple[float, ...]] = Field(
        default_factory=dict, description="extra per-workload rate multipliers (ascending)"
    )
    solver: str = Field(default="highs-exact", description="solver preset name or TOML file")
    time_limit_s: float | None = Field(default=None, gt=0, le=1e6, description="per cell, s")
    rel_gap: float | None = Field(default=None, ge=0, lt=1)
    # kind oppoints
    load_points: int = Field(
        default=65, ge=2, description="load grid points (limit: --limit load_points=N)"
    )
    load_max_rps: float | None = Field(
        default=None, gt=0, le=1_000_000, description="top of the load grid"
    )

    @field_validator("slo_tiers")
    @classmethod
    def _unique_tiers(cls, tiers: tuple[SloTier, ...]) -> tuple[SloTier, ...]:
        _no_duplicates([t.name for t in tiers])
        return tiers

    @field_validator("gpu_types")
    @classmethod
    def _unique_types(cls, types: tuple[str, ...]) -> tuple[str, ...]:
        _no_duplicates(list(types))
        return types

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
        if self.kind == "oppoints" and (self.workload_scale or self.load_scale != (1.0,)):
            raise ValueError("load_scale and workload_scale are for kind plans")
        message = (
            over_limit("load_points", self.load_points, "load_points")
            if self.kind == "oppoints"
            else over_limit("the number of grid cells", self.cells(), "compile_cells")
        )
        if message:
            raise ValueError(message)
        return self

    def cells(self) -> int:
        """Grid cells of a plan table: SLO tiers x GPU types x load and workload scales."""
        return (
            max(len(self.slo_tiers), 1)
            * max(len(self.gpu_types), 1)
            * len(self.load_scale)
            * math.prod(len(v) for v in self.workload_scale.values())
        )


def load_compile_spec(path: str | Path) -> tuple[CompileSpec, Path]:
    """The spec and the resolved path of its base instance."""
    p = Path(path)
    spec = load(CompileSpec, p)
    base = Path(spec.base)
    if not base.is_absolute():
        base = p.parent / base
    return spec, base


def spec_problems(spec: CompileSpec, problem: Problem, source: str) -> list[str]:
    """'source: field: message' lines for names the base instance or catalog lacks."""
    lines = []
    for i, name in enumerate(spec.gpu_types):
        try:
            problem.gpu_type(name)
        except KeyError as exc:
            lines.append(f"{source}: gpu_types[{i}]: {exc.args[0]}")
    names = [w.name for w in problem.instance.workloads]
    for name in spec.workload_scale:
        if name not in names:
            lines.append(
                f"{source}: workload_scale.{name}: no such workload in the base instance; "
                f"known: {', '.join(names)}"
            )
    return lines


def load_checked(path: str | Path) -> tuple[CompileSpec, Path, Problem]:
    """The spec, its base instance's path and problem; SpecError naming the spec file
    and the field for a missing base file, an unknown GPU type or workload."""
    spec, base = load_compile_spec(path)
    if not base.is_file():
        raise SpecError([f"{path}: base: {base}: no such file"])
    problem = load_problem(base)
    lines = spec_problems(spec, problem, str(path))
    if lines:
        raise SpecError(lines)
    return spec, base, problem
