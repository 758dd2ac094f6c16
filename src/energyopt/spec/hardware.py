"""GPU type specification: the public figures the performance model needs."""

from __future__ import annotations

from pydantic import Field, model_validator

from energyopt.spec.base import Spec

MAX_CLOCK_MHZ = 10_000
"""Highest SM clock any field takes, MHz (GPUs run below 3 GHz)."""
MAX_POWER_W = 10_000
"""Highest per-GPU power any field takes, W (the largest boards draw about 1.2 kW)."""


class MigProfile(Spec):
    """A Multi-Instance GPU profile (for example ``1g.10gb``)."""

    name: str = Field(min_length=1)
    compute_slices: int = Field(gt=0, le=64, description="compute slices out of the GPU's total")
    memory_gb: float = Field(gt=0, le=10_000, description="memory of the instance, GB")
    sm_count: int = Field(gt=0, le=10_000, description="SMs of the instance")
    max_instances: int = Field(gt=0, le=64, description="how many fit on one GPU")
    memory_slices: int | None = Field(
        default=None, gt=0, description="memory slices the instance occupies (NVML placement size)"
    )
    placements: tuple[int, ...] = Field(
        default=(), description="allowed start memory slices (NVML placements); empty: aligned"
    )
    media_extensions: bool = Field(default=False, description="a +me profile (all media engines)")


class PowerParams(Spec):
    """Shape of the power model (fitted constants; see docs/performance-model.md)."""

    sm_fraction: float = Field(
        default=0.85, gt=0, le=1, description="part of (TDP - idle) drawn by SMs at full load"
    )
    memory_bound_sm_activity: float = Field(
        default=0.45, ge=0, le=1, description="SM activity of a memory-bound kernel, 0..1"
    )
    voltage_floor: float = Field(
        default=0.7, gt=0, le=1, description="V(f)/V(f_max) at and below the knee clock"
    )
    knee_fraction: float = Field(
        default=0.55, gt=0, lt=1, description="knee clock as a fraction of the max SM clock"
    )
    locked_clock_w: float = Field(
        default=0.0, ge=0, le=10_000, description="extra static power at the max clock when on (W)"
    )


class Efficiency(Spec):
    """Achieved fractions of the roofline peaks (fitted on measured tables)."""

    compute: float = Field(default=0.7, gt=0, le=1, description="achieved / peak FLOP/s")
    memory: float = Field(default=0.8, gt=0, le=1, description="achieved / peak bandwidth")
    step_overhead_ms: float = Field(
        default=0.0, ge=0, le=1_000, description="fixed cost per forward pass at the max clock (ms)"
    )
    allreduce_latency_ms: float = Field(
        default=0.01,
        ge=0,
        le=1_000,
        description="fixed cost of one tensor-parallel all-reduce (ms)",
    )
    link: float = Field(default=0.7, gt=0, le=1, description="achieved / peak GPU-GPU bandwidth")
    compute_clock_fixed: float = Field(
        default=0.2471,
        ge=0,
        le=1,
        description="part of compute-bound time at the max clock that does not follow the SM "
        "clock (default: fitted on the Perseus A100 sweep)",
    )
    overhead_clock_fixed: float = Field(
        default=0.3847,
        ge=0,
        le=1,
        description="part of step_overhead_ms that is host time and does not follow the SM "
        "clock (default: fitted on the H100 NVL sweep)",
    )
    latency_error: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="measured error of the modelled pass latency on this type (fraction): the "
        "margin that options.latency_margin: calibrated plans with",
    )


class GpuType(Spec):
    """A GPU model with its public specifications. Units are in the field names."""

    name: str = Field(min_length=1)
    sm_count: int = Field(gt=0, le=10_000)
    memory_gb: float = Field(ge=0.1, le=10_000, description="device memory, GB (1e9 bytes)")
    memory_bandwidth_gbps: float = Field(
        ge=1, le=100_000, description="peak memory bandwidth, GB/s (at least 1)"
    )
    peak_bf16_tflops: float = Field(
        ge=0.01, le=100_000, description="dense BF16 tensor peak at max clock (TFLOP/s)"
    )
    max_sm_clock_mhz: int = Field(gt=0, le=MAX_CLOCK_MHZ)
    min_sm_clock_mhz: int = Field(gt=0, le=MAX_CLOCK_MHZ)
    default_sm_clock_mhz: int = Field(
        gt=0, le=MAX_CLOCK_MHZ, description="clock the tables were measured at"
    )
    sm_clock_step_mhz: int = Field(gt=0, le=1_000, description="spacing of supported clocks, MHz")
    supported_sm_clocks_mhz: tuple[int, ...] | None = Field(
        default=None, min_length=1, description="explicit NVML list; else min..max by step"
    )
    tdp_w: float = Field(gt=0, le=MAX_POWER_W)
    idle_w: float = Field(ge=0.1, le=MAX_POWER_W)
    power_limit_min_w: float = Field(ge=1, le=MAX_POWER_W)
    power_limit_max_w: float = Field(ge=1, le=MAX_POWER_W)
    nvlink_gbps: float = Field(
        default=0.0, ge=0, le=100_000, description="per-GPU NVLink bandwidth, GB/s"
    )
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_total_slices: int = Field(default=7, gt=0, le=64)
    mig_memory_slices: int = Field(
        default=8, gt=0, le=64, description="MIG memory slices of the GPU"
    )
    power: PowerParams = PowerParams()
    efficiency: Efficiency = Efficiency()
    sources: dict[str, str] = Field(default_factory=dict, description="field -> citation")

    @model_validator(mode="after")
    def _check_ranges(self) -> GpuType:
        if self.min_sm_clock_mhz > self.max_sm_clock_mhz:
            raise ValueError("min_sm_clock_mhz exceeds max_sm_clock_mhz")
        if not self.min_sm_clock_mhz <= self.default_sm_clock_mhz <= self.max_sm_clock_mhz:
            raise ValueError("default_sm_clock_mhz is outside [min, max]")
        if self.idle_w >= self.tdp_w:
            raise ValueError("idle_w must be below tdp_w")
        if self.power_limit_min_w > self.power_limit_max_w:
            raise ValueError("power_limit_min_w exceeds power_limit_max_w")
        if self.power_limit_max_w > self.tdp_w:
            raise ValueError(
                f"power_limit_max_w {self.power_limit_max_w:g} W exceeds tdp_w {self.tdp_w:g} W"
            )
        for clock in self.supported_sm_clocks_mhz or ():
            if not self.min_sm_clock_mhz <= clock <= self.max_sm_clock_mhz:
                raise ValueError(
                    f"supported_sm_clocks_mhz: {clock} MHz is outside min_sm_clock_mhz.."
                    f"max_sm_clock_mhz ({self.min_sm_clock_mhz}..{self.max_sm_clock_mhz})"
                )
        names = [p.name for p in self.mig_profiles]
        for profile in self.mig_profiles:
            if names.count(profile.name) > 1:
                raise ValueError(f"mig_profiles: {profile.name!r} is given twice")
            if profile.compute_slices > self.mig_total_slices:
                raise ValueError(
                    f"mig_profiles: {profile.name} has {profile.compute_slices} compute slices, "
                    f"more than mig_total_slices ({self.mig_total_slices})"
                )
            if profile.compute_slices * profile.max_instances > self.mig_total_slices:
                raise ValueError(
                    f"mig_profiles: {profile.max_instances} x {profile.name} need "
                    f"{profile.compute_slices * profile.max_instances} compute slices, more "
                    f"than mig_total_slices ({self.mig_total_slices})"
                )
            if profile.memory_gb > self.memory_gb or profile.sm_count > self.sm_count:
                raise ValueError(
                    f"mig_profiles: {profile.name} has more memory or SMs than the GPU"
                )
            problem = self._placement_problem(profile)
            if problem:
                raise ValueError(f"mig_profiles: {profile.name}: {problem}")
        return self

    def _placement_problem(self, profile: MigProfile) -> str | None:
        """Why ``profile``'s memory slices or placements cannot be on this GPU; None if
        they can. A start is a memory slice index, 0 .. mig_memory_slices - size (NVML's
        placements); one outside was dropped quietly, and a negative one counted from the
        end of the GPU's slices."""
        size = profile.memory_slices
        if size is not None and size > self.mig_memory_slices:
            return (
                f"memory_slices {size} is more than the GPU's mig_memory_slices "
                f"({self.mig_memory_slices})"
            )
        if len(set(profile.placements)) != len(profile.placements):
            return f"placements {list(profile.placements)} give a start twice"
        last = self.mig_memory_slices - (size or 1)
        for start in profile.placements:
            if not 0 <= start <= last:
                return (
                    f"placement {start} is not a start memory slice from 0 to {last} "
                    f"(the GPU has {self.mig_memory_slices} memory slices"
                    + (f"; the profile occupies {size})" if size else ")")
                )
        return None

    def sm_clocks_mhz(self) -> tuple[int, ...]:
        """Every SM clock the device accepts, ascending (MHz)."""
        if self.supported_sm_clocks_mhz:
            return tuple(sorted(set(self.supported_sm_clocks_mhz)))
        step = self.sm_clock_step_mhz
        clocks = list(range(self.min_sm_clock_mhz, self.max_sm_clock_mhz + 1, step))
        if clocks[-1] != self.max_sm_clock_mhz:
            clocks.append(self.max_sm_clock_mhz)
        return tuple(clocks)

    def nearest_clocks_mhz(self, clock_mhz: float, count: int = 2) -> tuple[int, ...]:
        """The supported clocks closest to ``clock_mhz`` (for error messages)."""
        ranked = sorted(self.sm_clocks_mhz(), key=lambda c: (abs(c - clock_mhz), c))
        return tuple(sorted(ranked[:count]))

    def mig_profile(self, name: str) -> MigProfile:
        """The MIG profile called ``name``; KeyError if this GPU has none by that name."""
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        raise KeyError(name)
