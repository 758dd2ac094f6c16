"""Keep-alive file (``kind: keepalive``): serverless functions kept warm, tepid or cold.

Time is cut into windows of ``window_s`` seconds. In every window each function
is in one state on one node:

- ``warm``: loaded and ready on the node's GPU; holds ``warm`` memory and power,
  a request starts at once;
- ``tepid``: kept in a cheaper state (weights in host memory, container paused);
  holds ``tepid`` memory and power, a request first resumes (``tepid.resume_s``,
  ``tepid.resume_j``) and the container pauses again afterwards (``tepid.enter_j``);
- ``cold``: nothing kept; a request pays the full cold start (``cold_start``) on
  the node, and the container is evicted afterwards.

Moving between states at a window boundary costs the transition's energy, and a
transition that takes longer than a window is impossible. A function's forecast is
either its request count per window (``arrivals``) or a histogram of its
inter-arrival times (``inter_arrivals``), read as ``window_s`` / mean inter-arrival
time expected requests in every window. Units are in the field
names; docs/formulations/keepalive.md states the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.limits import over_limit

MAX_WINDOWS = 10_080
"""Most windows in one file (a week of minutes)."""
MAX_TIME_S = 86_400.0
"""Longest time any keep-alive field takes, s (one day)."""
MAX_POWER_W = 1e6
MAX_MEMORY_GB = 1e6
MAX_ENERGY_J = 1e12
MAX_REQUESTS_PER_WINDOW = 10_000_000
MAX_HISTOGRAM_BINS = 100_000
MAX_HISTOGRAM_COUNT = 10**12

State = Literal["warm", "tepid", "cold"]
STATES: tuple[State, ...] = ("warm", "tepid", "cold")


class Holding(Spec):
    """What a function holds while kept in one state."""

    gpu_memory_gb: float = Field(ge=0, le=MAX_MEMORY_GB, description="GPU memory held, GB")
    host_memory_gb: float = Field(ge=0, le=MAX_MEMORY_GB, description="host memory held, GB")
    power_w: float = Field(ge=0, le=MAX_POWER_W, description="power drawn while kept, W")


class TepidState(Holding):
    """The tepid state: what it holds and how the function enters and leaves it."""

    enter_s: float = Field(ge=0, le=MAX_TIME_S, description="warm -> tepid time, s")
    enter_j: float = Field(ge=0, le=MAX_ENERGY_J, description="warm -> tepid energy, J")
    resume_s: float = Field(ge=0, le=MAX_TIME_S, description="tepid -> warm time, s")
    resume_j: float = Field(ge=0, le=MAX_ENERGY_J, description="tepid -> warm energy, J")


class ColdStart(Spec):
    """A cold start: container start plus weight load onto the GPU."""

    time_s: float = Field(ge=0, le=MAX_TIME_S, description="cold -> warm time, s")
    energy_j: float = Field(ge=0, le=MAX_ENERGY_J, description="cold -> warm energy, J")


class Service(Spec):
    """One request once its container is warm."""

    time_s: float = Field(gt=0, le=MAX_TIME_S, description="service time per request, s")
    power_w: float = Field(ge=0, le=MAX_POWER_W, description="power while serving, W")


class StartSlo(Spec):
    """Start latency (time from arrival until the request starts on a warm container)."""

    start_latency_s: float = Field(ge=0, le=MAX_TIME_S, description="start-latency limit, s")
    percentile: float = Field(
        gt=0, le=100, description="share of the function's requests, %, that start within it"
    )


class InterArrivalHistogram(Spec):
    """A function's forecast as a histogram of the times between its requests.

    Bin i counts inter-arrival times in [i bin_s, (i + 1) bin_s) and prices them at
    the bin's centre, so the mean inter-arrival time is m = sum_i c_i (i + 1/2)
    bin_s / sum_i c_i. Read as a stationary renewal process, the requests expected
    in any window of w seconds are exactly w / m (the same in every window).
    """

    bin_s: float = Field(gt=0, le=MAX_TIME_S, description="width of each bin, s")
    counts: tuple[int, ...] = Field(
        min_length=1,
        max_length=MAX_HISTOGRAM_BINS,
        description="inter-arrival times observed in each bin",
    )
    windows: int = Field(ge=1, le=MAX_WINDOWS, description="windows the forecast covers")

    @model_validator(mode="after")
    def _check(self) -> InterArrivalHistogram:
        if any(c < 0 or c > MAX_HISTOGRAM_COUNT for c in self.counts):
            raise ValueError(f"counts: each bin's count must lie in 0..{MAX_HISTOGRAM_COUNT:,}")
        if sum(self.counts) == 0:
            raise ValueError("counts: the histogram is empty (every bin is 0)")
        return self

    def mean_s(self) -> float:
        """Mean inter-arrival time, s (each bin at its centre)."""
        total = sum(self.counts)
        return self.bin_s * sum(c * (i + 0.5) for i, c in enumerate(self.counts)) / total

    def per_window(self, window_s: float) -> float:
        """Requests expected in one window of ``window_s`` seconds."""
        return window_s / self.mean_s()


class Function(Spec):
    """One serverless function (a model instance or any GPU function)."""

    name: str = Field(min_length=1)
    warm: Holding
    tepid: TepidState | None = Field(
        default=None, description="the tepid state; none: the function has no tepid state"
    )
    cold_start: ColdStart
    service: Service
    arrivals: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_WINDOWS,
        description="forecast requests in each window (one count per window)",
    )
    inter_arrivals: InterArrivalHistogram | None = Field(
        default=None, description="the forecast as an inter-arrival histogram instead"
    )
    slo: StartSlo | None = Field(default=None, description="overrides the file's slo")
    nodes: tuple[str, ...] | None = Field(
        default=None, description="nodes the function may be placed on; default all"
    )

    @model_validator(mode="after")
    def _check(self) -> Function:
        if (self.arrivals is None) == (self.inter_arrivals is None):
            raise ValueError(
                "arrivals: give the forecast either as arrivals (per-window counts) or as "
                "inter_arrivals (a histogram), not both or neither"
            )
        if self.arrivals is not None and any(
            a < 0 or a > MAX_REQUESTS_PER_WINDOW for a in self.arrivals
        ):
            raise ValueError(f"arrivals: request counts must lie in 0..{MAX_REQUESTS_PER_WINDOW:,}")
        if self.nodes is not None and len(set(self.nodes)) != len(self.nodes):
            raise ValueError("nodes: a node is named twice")
        return self

    @property
    def n_windows(self) -> int:
        """Windows the forecast covers."""
        if self.arrivals is not None:
            return len(self.arrivals)
        assert self.inter_arrivals is not None
        return self.inter_arrivals.windows

    def window_arrivals(self, window_s: float) -> tuple[float, ...]:
        """Requests expected in each window: the counts as given, or a histogram's
        ``window_s`` / mean inter-arrival time in every window."""
        if self.arrivals is not None:
            return tuple(float(a) for a in self.arrivals)
        assert self.inter_arrivals is not None
        return (self.inter_arrivals.per_window(window_s),) * self.inter_arrivals.windows


class Node(Spec):
    """A node: its GPU memory (all its GPUs together), host memory and power budget."""

    name: str = Field(min_length=1)
    gpu_memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB, description="GPU memory, GB")
    host_memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB, description="host memory, GB")
    power_budget_w: float = Field(
        gt=0,
        le=MAX_POWER_W,
        description="average power the functions on it may draw in any window, W",
    )


class KeepAliveObjective(Spec):
    """``energy``: least energy, every function's start-latency SLO held at its
    percentile. ``throughput``: most requests per second that start within their
    function's start-latency limit (the SLO's percentile is then not a constraint),
    and among those plans least energy. Either optionally with a cap on the share of
    requests that start cold."""

    kind: Literal["energy", "throughput"] = "energy"
    max_cold_start_rate: float | None = Field(
        default=None, ge=0, le=1, description="cold starts per request over the horizon"
    )


class KeepAliveFile(Spec):
    """A keep-alive problem: functions, nodes, their forecast and the objective."""

    kind: Literal["keepalive"]
    name: str = Field(min_length=1)
    description: str = ""
    window_s: float = Field(gt=0, le=MAX_TIME_S, description="length of one window, s")
    nodes: tuple[Node, ...] = Field(min_length=1, max_length=1_000)
    functions: tuple[Function, ...] = Field(min_length=1, max_length=10_000)
    slo: StartSlo | None = Field(default=None, description="start-latency SLO of every function")
    objective: KeepAliveObjective = KeepAliveObjective()

    @model_validator(mode="after")
    def _check(self) -> KeepAliveFile:
        for what, names in (
            ("nodes", [n.name for n in self.nodes]),
            ("functions", [f.name for f in self.functions]),
        ):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"{what}: {name!r} is named twice")
                seen.add(name)
        lengths = {f.n_windows for f in self.functions}
        if len(lengths) > 1:
            raise ValueError(
                "functions: every function's arrivals (or inter_arrivals.windows) must "
                f"cover the same windows (lengths {sorted(lengths)})"
            )
        return self

    @field_validator("functions")
    @classmethod
    def _size_limit(
        cls, functions: tuple[Function, ...], info: ValidationInfo
    ) -> tuple[Function, ...]:
        nodes = len(info.data.get("nodes", ()))
        windows = max(f.n_windows for f in functions)
        message = over_limit(
            f"functions x states x windows ({len(functions):,} x 3 per node x {nodes:,} "
            f"nodes x {windows:,})",
            len(functions) * 3 * nodes * windows,
            "keepalive_cells",
        )
        if message:
            raise ValueError(message)
        return functions


class FunctionSchedule(Spec):
    """One function's state and node in every window."""

    function: str = Field(min_length=1)
    states: tuple[State, ...] = Field(min_length=1, max_length=MAX_WINDOWS)
    nodes: tuple[str, ...] = Field(min_length=1, max_length=MAX_WINDOWS)


class KeepAlivePlan(Spec):
    """A keep-alive plan, with the figures of the solve that made it."""

    UNCHECKED_NUMBERS = frozenset({"objective", "bound", "gap"})

    name: str = ""
    functions: tuple[FunctionSchedule, ...] = Field(min_length=1)
    objective: float | None = Field(
        default=None,
        description="energy over the horizon, J, or throughput within the start SLO, requests/s",
    )
    objective_unit: str = "J"
    bound: float | None = Field(
        default=None, description="bound on the optimum (lower for energy, upper for throughput)"
    )
    gap: float | None = None
    status: str = ""
    solver: str = ""
