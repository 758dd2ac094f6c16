"""Evaluation spec (``kind: evaluate``): a base instance, a load over time, the
planners to compare, and how the simulator replays them. See docs/evaluation.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.io import load
from energyopt.spec.limits import over_limit


def _load_scale_limit(scale: float) -> None:
    message = over_limit("load_scale", scale, "load_scale")
    if message:
        raise ValueError(message)


PlannerKind = Literal[
    "performance-first",
    "consolidation-only",
    "frequency-only",
    "sharing-only",
    "energyopt",
    "table",
]


class TraceLoad(Spec):
    """Requests replayed from a trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""

    kind: Literal["trace"]
    file: str = Field(min_length=1, description="trace CSV, relative to the spec file")
    start_s: float = Field(default=0.0, ge=0, le=1e10, description="offset into the trace, s")
    load_scale: float = Field(
        default=1.0,
        gt=0,
        description="the trace is rescaled so its mean rate is this times the sum of the "
        "base instance's workload rates (req/s)",
    )
    tokens: Literal["trace", "scaled"] = Field(
        default="trace",
        description="trace: the trace's token counts; scaled: rescaled per workload so "
        "their means equal the workload's prompt/output means",
    )

    @model_validator(mode="after")
    def _check(self) -> TraceLoad:
        _load_scale_limit(self.load_scale)
        return self


class Spike(Spec):
    """A sudden step of the load: the rate is multiplied by ``factor`` in
    ``[at_s, at_s + duration_s)``."""

    at_s: float = Field(ge=0, le=7 * 86400, description="start, s")
    duration_s: float = Field(gt=0, le=7 * 86400, description="length, s")
    factor: float = Field(gt=0, le=100, description="rate multiplier inside the spike")


class DiurnalLoad(Spec):
    """Poisson arrivals whose rate follows a sine: base x load_scale x (1 + a sin),
    times each spike's factor while it lasts."""

    kind: Literal["diurnal"]
    load_scale: float = Field(default=1.0, gt=0, description="multiplier of every base rate")
    amplitude: float = Field(default=0.6, ge=0, lt=1, description="relative swing of the rate")
    period_s: float | None = Field(
        default=None, gt=0, le=1e10, description="length of one day, s (default: the duration)"
    )
    token_sigma: float = Field(
        default=0.6, ge=0, le=3, description="log-normal shape of token counts (0: fixed)"
    )
    spikes: tuple[Spike, ...] = Field(default=(), max_length=100)

    @model_validator(mode="after")
    def _check(self) -> DiurnalLoad:
        peak = max((s.factor for s in self.spikes), default=1.0)
        _load_scale_limit(self.load_scale * max(peak, 1.0))
        return self


class BurstyLoad(Spec):
    """Poisson arrivals modulated by on/off bursts (a two-state Markov process)."""

    kind: Literal["bursty"]
    load_scale: float = Field(
        default=1.0, gt=0, description="long-run mean rate as a multiple of the base rates"
    )
    burst_factor: float = Field(
        default=3.0, ge=1, le=1_000, description="rate in a burst / rate outside"
    )
    burst_s: float = Field(default=20.0, ge=0.001, le=1e10, description="mean burst length, s")
    gap_s: float = Field(
        default=180.0, ge=0.001, le=1e10, description="mean time between bursts, s"
    )
    token_sigma: float = Field(default=0.6, ge=0, le=3)

    @model_validator(mode="after")
    def _check(self) -> BurstyLoad:
        _load_scale_limit(self.load_scale * self.burst_factor)
        return self


Load = Annotated[TraceLoad | DiurnalLoad | BurstyLoad, Field(discriminator="kind")]


class Forecast(Spec):
    """How a planner predicts the next epoch's load from the recent past
    (sim/forecast.py, docs/forecasting.md)."""

    method: Literal["last", "peak", "trend", "holt", "seasonal", "quantile", "auto", "oracle"] = (
        Field(
            default="trend",
            description="last: mean rate of the history; peak: highest window rate of the "
            "history; trend: peak or the history's linear trend at the end of the coming "
            "epoch, whichever is higher; holt: exponential smoothing with a damped trend; "
            "seasonal: Holt-Winters with a season of season_s; quantile: the quantile of "
            "the history's window rates; auto: per workload, the method whose past "
            "forecasts needed the least capacity, scaled to cover error_quantile of the "
            "past epochs' peaks; oracle: highest window rate of the coming epoch (an upper "
            "reference)",
        )
    )
    window_s: float = Field(
        default=30.0, ge=0.001, le=1e7, description="rate measurement window, s"
    )
    history_s: float | None = Field(
        default=None,
        gt=0,
        le=1e7,
        description="how far back to look, s (default: one epoch; holt and seasonal: "
        "everything since time 0)",
    )
    headroom: float = Field(default=1.1, ge=1, le=100, description="forecast multiplier")
    quantum: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="forecast rates are rounded up to multiples of this fraction of the "
        "base rate (fewer distinct solves)",
    )
    floor: float = Field(
        default=0.02, gt=0, le=1, description="smallest forecast, as a fraction of the base rate"
    )
    season_s: float | None = Field(
        default=None,
        gt=0,
        le=1e10,
        description="length of the load's season (e.g. a day), s: seasonal needs it; auto "
        "considers seasonal only when it is given",
    )
    quantile: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="quantile: which quantile of the history's window rates (1: the peak)",
    )
    error_quantile: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="auto: quantile of (an epoch's highest window rate / its capacity "
        "forecast) that a method's score uses",
    )
    lookahead_s: float = Field(
        default=0.0,
        ge=0,
        le=1e7,
        description="oracle only: also cover this many seconds after the coming epoch (the "
        "time the next plan's new instances take to be ready), s",
    )

    @model_validator(mode="after")
    def _check(self) -> Forecast:
        if self.lookahead_s > 0 and self.method != "oracle":
            raise ValueError(f"lookahead_s: only the oracle looks ahead, not method {self.method}")
        if self.method == "seasonal" and self.season_s is None:
            raise ValueError("season_s: method seasonal needs season_s (the season's length, s)")
        if self.season_s is not None and self.season_s < 2 * self.window_s - 1e-9:
            raise ValueError(
                f"season_s: {self.season_s:g} s is shorter than two windows "
                f"(window_s {self.window_s:g} s)"
            )
        return self


class Transitions(Spec):
    """Latencies and power of changing a GPU's state."""

    power_on_s: float = Field(
        default=10.0, ge=0, le=86_400, description="off to on, before loading, s"
    )
    clock_change_ms: float = Field(
        default=50.0, ge=0, le=86_400_000, description="no work while it settles"
    )
    load_gbps: float = Field(
        default=20.0, ge=0.001, le=1e6, description="weight loading bandwidth, GB/s"
    )
    startup_s: float = Field(
        default=2.0, ge=0, le=86_400, description="fixed start of a serving process"
    )
    standby_w: float = Field(
        default=0.0, ge=0, le=10_000, description="power of a GPU that is off, W"
    )

    def instance_start_s(self, weight_bytes: float) -> float:
        """Seconds from a GPU being on until a new serving instance with
        ``weight_bytes`` of weights on it serves: the process start (``startup_s``)
        plus the weights at ``load_gbps``."""
        return self.startup_s + weight_bytes / (self.load_gbps * 1e9)


class OnlineOptions(Spec):
    """The online control of planners with ``online: true`` (docs/online.md)."""

    error_quantile: float = Field(
        default=0.9, gt=0, lt=1, description="quantile of the forecast error used as headroom"
    )
    error_epochs: int = Field(
        default=3, ge=1, le=10_000, description="epochs of forecast errors the quantile uses"
    )
    max_headroom: float = Field(default=2.0, ge=1, le=100, description="largest headroom")
    min_headroom: float = Field(
        default=0.8, gt=0, le=1, description="smallest headroom (below 1: the forecast overshoots)"
    )
    risk_utilization: float = Field(
        default=1.0, gt=0, le=1, description="observed rate / capacity above which at risk"
    )
    calm_utilization: float = Field(
        default=0.85, gt=0, le=1, description="below this at the plan's clock a boost ends"
    )
    hold_s: float = Field(default=5.0, ge=0, le=86_400, description="least boost length, s")
    rate_tau_s: float = Field(
        default=10.0, gt=0, le=86_400, description="time constant of the observed-rate meters, s"
    )
    fast_tau_s: float = Field(
        default=2.0,
        gt=0,
        le=86_400,
        description="time constant of the fast meters that warn of a burst's onset, s",
    )
    backlog_fraction: float = Field(
        default=1.0, gt=0, le=1_000, description="queue (in TTFT SLOs of capacity) that is at risk"
    )
    queue_factor: float = Field(
        default=2.0, gt=0, le=1_000, description="queue bound in TTFT SLOs of work at max clock"
    )
    wake_after_s: float = Field(
        default=5.0, ge=0, le=86_400, description="forecast error lasting this wakes a GPU, s"
    )
    burst_memory_s: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="a workload's highest rate in the current and the previous window of "
        "this length, s, is remembered, "
        "and a boost of a slice at risk covers its part of it at once (0: off)",
    )
    burst_tau_s: float = Field(
        default=5.0,
        gt=0,
        le=86_400,
        description="time constant of the per-workload meter whose peak burst_memory_s keeps, s",
    )
    harvest_start_floor: float = Field(
        default=0.0,
        ge=0,
        le=10_000,
        description="a harvest leaves every slice a capacity that starts at least this many "
        "requests within its TTFT SLO (0: no floor)",
    )
    attainment_target: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="per workload, the TTFT attainment (fraction of first tokens within the "
        "SLO) below which the online control tightens its rules for that workload "
        "(online/attainment.py; 0: off)",
    )
    guard_tau_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="time constant of the attainment guard's counts of on-time and late "
        "first tokens, s",
    )
    guard_hold_s: float = Field(
        default=10.0,
        ge=0,
        le=86_400,
        description="least time between two changes of a workload's attainment-guard factor, s",
    )
    guard_step: float = Field(
        default=0.1, gt=0, le=10, description="relative step of the attainment-guard factor"
    )
    guard_max_factor: float = Field(
        default=2.0, ge=1, le=100, description="largest attainment-guard factor"
    )
    tail_reserve: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="plan each workload for at least this fraction of its burst peak (the "
        "tail_quantile of its rate over tail_window_s windows of the forecast's history; "
        "0: off)",
    )
    guard_reserve: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="plan a workload for at least this fraction of its burst peak (as "
        "tail_reserve) at the first plan and at every later plan made while its "
        "attainment-guard factor is above 1 (online/attainment.py: plan_reserves; needs "
        "attainment_target; 0: off)",
    )
    tail_window_s: float = Field(
        default=5.0, gt=0, le=86_400, description="window of the burst peak's rates, s"
    )
    tail_quantile: float = Field(
        default=0.99, ge=0, le=1, description="quantile of the window rates that is the peak"
    )
    protect_tbt: bool = Field(
        default=False,
        description="the local scheduler shrinks the prefill chunk below the plan's when the "
        "iteration at the current clock would exceed twice the TBT SLO while requests decode",
    )
    shift: bool = Field(default=True, description="shift MPS share between co-located slices")
    wake: bool = Field(default=True, description="wake GPUs the plan left off")
    local: bool = Field(default=True, description="run the phase-aware local scheduler")
    max_chunk: int = Field(
        default=4096, ge=1, le=1_000_000, description="largest prefill chunk, tokens"
    )
    replan_on_surprise: bool = Field(
        default=True,
        description="re-plan at once (warm-started) when a workload's rate leaves its band",
    )
    surprise_s: float = Field(
        default=3.0, ge=0, le=86_400, description="out of band this long is a surprise, s"
    )
    surprise_cooldown_s: float = Field(
        default=60.0, ge=0, le=86_400, description="least time between surprises of one workload, s"
    )
    surprise_window_s: float = Field(
        default=5.0, gt=0, le=86_400, description="window of the rate the band is checked on, s"
    )
    surprise_check_s: float = Field(
        default=1.0, gt=0, le=86_400, description="time between two checks of the bands, s"
    )
    consolidate_on_drop: bool = Field(
        default=False,
        description="re-plan (warm-started) for the observed rates when a workload's rate "
        "stays below its lower band, turning off GPUs no longer needed, when the power saved "
        "until the next epoch pays the transitions (docs/online.md)",
    )
    consolidate_below: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="a workload is below its lower band when its observed rate times 1 + its "
        "error spread is below 1 - this times its planned rate",
    )
    consolidate_s: float = Field(
        default=10.0, ge=0, le=86_400, description="below the lower band this long, s"
    )
    consolidate_cooldown_s: float = Field(
        default=60.0, ge=0, le=86_400, description="least time between two consolidations, s"
    )
    consolidate_keeps_peak: bool = Field(
        default=True,
        description="a consolidation leaves each workload's recent burst, at its ratio to the "
        "load's level times the observed rate, within its placements' SLO capacity at the "
        "highest clock (with burst_memory_s > 0)",
    )

    @model_validator(mode="after")
    def _check(self) -> OnlineOptions:
        if self.calm_utilization > self.risk_utilization:
            raise ValueError("calm_utilization must not exceed risk_utilization")
        if self.guard_reserve > 0 and self.attainment_target <= 0:
            raise ValueError(
                "guard_reserve: follows the attainment guard's factors; set "
                "attainment_target (> 0) too"
            )
        return self


class PlannerSpec(Spec):
    """One contender: a baseline, an energyopt solver preset, or a plan table."""

    name: str = Field(min_length=1, description="label in the report")
    kind: PlannerKind
    solver: str = Field(default="highs-exact", description="preset for solver-based planners")
    table: str | None = Field(default=None, description="plan table file (kind table)")
    time_limit_s: float = Field(default=20.0, gt=0, le=1e6, description="per solve, s")
    rel_gap: float = Field(default=0.005, ge=0, lt=1)
    online: bool = Field(
        default=False,
        description="run the online control between plans (the evaluation's online: block)",
    )
    fill_overload: bool = Field(
        default=False,
        description="where the forecast exceeds what the fleet serves, plan for all it can "
        "serve: single workloads raised above the back-off's fraction where the capacity "
        "test still packs, and the GPUs the plan leaves off given to the workloads with "
        "forecast unserved (docs/online.md, 'Epoch plans'); false: the uniform back-off's "
        "plan alone",
    )
    latency_margin: Annotated[float, Field(ge=0, le=10)] | Literal["calibrated"] | None = Field(
        default=None,
        description="plan with this latency margin (options.latency_margin of the base "
        "instance; calibrated: each GPU type's measured error); default: the instance's",
    )

    @model_validator(mode="after")
    def _check(self) -> PlannerSpec:
        if self.kind == "table" and self.table is None:
            raise ValueError("a planner of kind table needs table: FILE")
        return self


DEFAULT_PLANNERS: tuple[PlannerSpec, ...] = (
    PlannerSpec(name="performance-first", kind="performance-first"),
    PlannerSpec(name="consolidation-only", kind="consolidation-only"),
    PlannerSpec(name="frequency-only", kind="frequency-only"),
    PlannerSpec(name="sharing-only", kind="sharing-only"),
    PlannerSpec(name="energyopt", kind="energyopt"),
)


class Evaluation(Spec):
    """An ``energyopt evaluate`` input file."""

    kind: Literal["evaluate"]
    name: str = Field(min_length=1)
    description: str = ""
    base: str = Field(min_length=1, description="serving instance, relative to the spec file")
    load: Load
    duration_s: float = Field(gt=0, le=7 * 86400, description="simulated time, s")
    epoch_s: float = Field(default=300.0, ge=1, le=7 * 86400, description="re-planning period, s")
    plan_ahead: bool = Field(
        default=False,
        description="start each epoch's plan the plan lead (power-on + start of the heaviest "
        "model) before the epoch's boundary, sized for the forecast from the boundary to the "
        "next one, so its new instances serve from the boundary (docs/online.md)",
    )
    forecast: Forecast = Forecast()
    planners: tuple[PlannerSpec, ...] = Field(default=DEFAULT_PLANNERS, min_length=1)
    reference: str = Field(
        default="performance-first", description="planner the energy saving is measured against"
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    output_dir: str = Field(default="evaluate-out", description="plots and CSV, relative to cwd")
    colocation_slowdown: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="iteration slowdown when the GPU's other instances are busy, times "
        "their busy SM share",
    )
    transitions: Transitions = Transitions()
    online: OnlineOptions = OnlineOptions()
    drain_s: float = Field(
        default=120.0,
        ge=0,
        le=7 * 86400,
        description="time after the end to finish requests in flight, s",
    )
    power_bin_s: float = Field(
        default=10.0, ge=0.001, le=7 * 86400, description="power time-series step, s"
    )

    @model_validator(mode="after")
    def _check(self) -> Evaluation:
        names = [p.name for p in self.planners]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate planner names: {dup}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not a planner; planners: {names}")
        if self.duration_s / self.power_bin_s > 10_000_000:
            raise ValueError(
                f"power_bin_s {self.power_bin_s:g} s cuts duration_s {self.duration_s:g} s "
                "into more than 10,000,000 bins"
            )
        return self


def load_evaluation(path: str | Path) -> Evaluation:
    """Read and validate an evaluation spec (SpecError naming file and field)."""
    return load(Evaluation, path)


def resolve_relative(spec_path: str | Path, rel: str) -> Path:
    """``rel`` taken relative to the folder of the spec file (unless absolute)."""
    p = Path(rel)
    return p if p.is_absolute() else Path(spec_path).parent / p
