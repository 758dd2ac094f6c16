"""A seeded generator of serverless function workloads with the published
statistics of a production function platform (Azure Functions).

``generate_functions`` draws N functions: each one's expected daily invocations
(log-normal in log10, clipped to the 8 decades the platform spans), arrival class
(timer, Poisson or bursty), mean execution time, memory, and whether it is a GPU
function (an LLM with measured ServerlessLLM load times) or a CPU function.
``generate_trace`` turns them into invocations over a horizon, with a diurnal
modulation of every non-timer function's rate. ``workload_statistics`` measures
on a trace what the module's constants target; ``keepalive_instance`` builds a
``kind: keepalive`` file from a trace. The trace format (Azure Functions
invocation trace 2021) is read and written by ``energyopt.families.keepalive.azure_functions``.

Sources of the targets (each constant names its figure):

- Shahrad et al., "Serverless in the Wild: Characterizing and Optimizing the
  Serverless Workload at a Large Cloud Provider", USENIX ATC 2020 (Azure Functions,
  July 2019, two weeks of the whole platform);
- ServerlessLLM (data/serverless/serverlessllm/load_times.csv) and the
  assumptions of ``energyopt.families.keepalive.llm_functions`` for the LLM functions.

Everything the sources do not give is marked "assumption" here and in
docs/formulations/keepalive.md. Times s, memory MB (functions) or GB (instances),
rates per day unless a name says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from energyopt.families.keepalive import llm_functions

ArrivalClass = Literal["timer", "poisson", "bursty"]
ARRIVAL_CLASSES: tuple[ArrivalClass, ...] = ("timer", "poisson", "bursty")

DAY_S = 86_400.0
"""Seconds in a day."""

SHARE_AT_MOST_HOURLY = 0.45
"""Share of applications invoked once per hour or less on average (24 a day or
fewer). Shahrad et al., USENIX ATC 2020, Fig. 5(a). Applied here per function
(assumption: one function per application, as for 54% of applications, Fig. 1)."""
SHARE_AT_MOST_PER_MINUTE = 0.81
"""Share of applications invoked once per minute or less on average (1,440 a day or
fewer). Shahrad et al., USENIX ATC 2020, Fig. 5(a)."""
DAILY_SPAN_DECADES = 8.0
"""Orders of magnitude between the least and the most invoked functions. Shahrad et
al., USENIX ATC 2020, abstract and Fig. 5(a) ("8-order-of-magnitude range of
invocation frequencies")."""

_Z = NormalDist()
LOG10_DAILY_SIGMA = (math.log10(1440.0) - math.log10(24.0)) / (
    _Z.inv_cdf(SHARE_AT_MOST_PER_MINUTE) - _Z.inv_cdf(SHARE_AT_MOST_HOURLY)
)
"""Standard deviation of log10(daily invocations), decades: the normal through the
two published points (assumption: log-normal shape)."""
LOG10_DAILY_MEAN = math.log10(24.0) - _Z.inv_cdf(SHARE_AT_MOST_HOURLY) * LOG10_DAILY_SIGMA
"""Mean of log10(daily invocations): the normal through the two published points."""

TRIGGER_SHARES: dict[str, float] = {
    "http": 0.55,
    "queue": 0.15,
    "event": 0.02,
    "orchestration": 0.07,
    "timer": 0.16,
    "storage": 0.03,
    "others": 0.02,
}
"""Share of functions per trigger group. Shahrad et al., USENIX ATC 2020, Fig. 2
(functions column: HTTP 55.0%, queue 15.2%, event 2.2%, orchestration 6.9%, timer
15.6%, storage 2.8%, others 2.2%; rounded to whole percent)."""
TRIGGER_CLASS: dict[str, ArrivalClass] = {
    "http": "poisson",
    "queue": "bursty",
    "event": "bursty",
    "orchestration": "bursty",
    "timer": "timer",
    "storage": "bursty",
    "others": "bursty",
}
"""Arrival class of each trigger group (assumption): timers are periodic, HTTP
requests from many independent users Poisson, queue, event, storage and
orchestration triggers fire in batches (Shahrad et al., Fig. 6: many applications
have inter-arrival CVs above 1, timers CV near 0)."""
CLASS_SHARES: dict[ArrivalClass, float] = {
    c: sum(s for t, s in TRIGGER_SHARES.items() if TRIGGER_CLASS[t] == c) for c in ARRIVAL_CLASSES
}
"""Share of functions per arrival class: timer 16%, Poisson 55%, bursty 29%."""

TIMER_JITTER_S = 0.5
"""Standard deviation of a timer's firing time, s, at most 1% of its period
(assumption); the inter-arrival CV of a timer is then at most 0.015."""
BURSTY_WEIBULL_SHAPE = 0.5
"""Weibull shape of a bursty function's inter-arrival times (assumption); its CV is
sqrt(Gamma(1 + 2/k) / Gamma(1 + 1/k)^2 - 1) = sqrt(5) = 2.24."""

EXEC_LN_MU = -0.38
"""Mean of ln(average execution time in s) of a function: the log-normal fit of
Shahrad et al., USENIX ATC 2020, Fig. 7 (median 0.68 s; 50% of functions run for
less than about 1 s on average)."""
EXEC_LN_SIGMA = 2.36
"""Standard deviation of ln(average execution time in s): the same fit, Fig. 7."""
EXEC_MIN_S = 0.001
"""Shortest execution time, s (the trace format's resolution, 1 ms)."""
EXEC_MAX_S = 600.0
"""Longest execution time, s: Azure Functions' maximum timeout on the Consumption
plan, 10 min (assumption: no function runs past it)."""
INVOCATION_LN_SIGMA = 0.3
"""Spread of one function's invocation times around its mean: ln-standard deviation
of a log-normal with the function's mean (assumption)."""

MEMORY_MEDIAN_MB = 170.0
"""Median allocated memory of an application, MB. Shahrad et al., USENIX ATC 2020,
Fig. 8 (50% of applications allocate at most 170 MB)."""
MEMORY_P90_MB = 400.0
"""90th percentile of allocated memory, MB. Shahrad et al., USENIX ATC 2020, Fig. 8
(90% of applications never consume more than 400 MB)."""
MEMORY_LN_SIGMA = math.log(MEMORY_P90_MB / MEMORY_MEDIAN_MB) / _Z.inv_cdf(0.9)
"""ln-standard deviation of memory: the log-normal through the two published
quantiles (assumption: log-normal shape; 0.668)."""

DIURNAL_PEAK_TO_TROUGH = 2.0
"""Ratio of the busiest to the quietest hour of the platform's invocations. Shahrad
et al., USENIX ATC 2020, Fig. 3 (clear diurnal and weekly patterns over a constant
baseline of roughly 50% of the peak)."""
DIURNAL_PEAK_HOUR = 14.0
"""Hour of the day (trace time) of the peak (assumption)."""

GPU_SHARE = 0.10
"""Share of GPU functions, each an LLM of ``llm_functions.MODELS`` chosen uniformly
(assumption; no public platform trace states it)."""

CPU_COLD_START_S = 1.0
"""Cold start of a CPU function, s (assumption, within the 0.91 s to 6.9 s of the
Huawei cold-start events quoted in data/SOURCES-new-families.md)."""
CPU_SERVICE_W = 15.0
"""Power of a CPU function while it runs, W (assumption: one busy server core with
its share of the socket)."""
NODE_HOST_GB = 1024.0
"""Host memory of a node, GB (the 1 TB of DDR4 of ServerlessLLM's A5000 server,
data/SOURCES-new-families.md; assumption for the H100 nodes)."""
NODE_POWER_W = 2000.0
"""Power budget of a node, W (assumption: one H100 at its 700 W limit, two CPU
sockets and the rest of the server)."""


@dataclass(frozen=True)
class FunctionProfile:
    """One generated function."""

    app: str
    func: str
    kind: Literal["cpu", "gpu"]
    arrival: ArrivalClass
    daily_invocations: float
    """Expected invocations per day (at the diurnal mean)."""
    mean_duration_s: float
    """Mean execution time, s (a GPU function: its model's measured mean)."""
    memory_mb: float
    """Allocated memory, MB (a GPU function: its weights and KV cache on the GPU)."""
    model: str = ""
    """A GPU function's model (a key of ``llm_functions.MODELS``); empty for CPU."""


@dataclass(frozen=True)
class FunctionTrace:
    """One function's invocations, ordered by start."""

    app: str
    func: str
    end_s: np.ndarray
    """End timestamp of each invocation, s from the trace's start."""
    duration_s: np.ndarray
    """Execution time of each invocation, s."""

    @property
    def start_s(self) -> np.ndarray:
        """Start (arrival) of each invocation, s: end minus duration."""
        return np.asarray(self.end_s - self.duration_s)


@dataclass(frozen=True)
class InvocationTrace:
    """Invocations of every function over ``horizon_s`` seconds."""

    functions: tuple[FunctionTrace, ...]
    horizon_s: float

    def by_key(self) -> dict[tuple[str, str], FunctionTrace]:
        """Each function's invocations by (app, func)."""
        return {(f.app, f.func): f for f in self.functions}

    def of(self, app: str, func: str) -> FunctionTrace:
        """One function's invocations (none where the trace does not name it: a trace
        file lists only functions invoked at least once)."""
        for f in self.functions:
            if f.app == app and f.func == func:
                return f
        return FunctionTrace(app, func, np.zeros(0), np.zeros(0))

    @property
    def invocations(self) -> int:
        """Number of invocations in the trace."""
        return int(sum(len(f.end_s) for f in self.functions))


def _hexid(rng: np.random.Generator, n_hex: int) -> str:
    return "".join(f"{b:02x}" for b in rng.integers(0, 256, size=n_hex // 2))


def _stratified_normal(rng: np.random.Generator, n: int, mu: float, sigma: float) -> np.ndarray:
    """``n`` normal draws, one from each of n equally likely strata in random order
    (Latin hypercube sampling), so that n functions follow the distribution's
    quantiles to within 1/n."""
    u = (rng.permutation(n) + rng.random(n)) / n
    u = np.clip(u, 1e-12, 1.0 - 1e-12)
    return np.array([mu + sigma * _Z.inv_cdf(float(x)) for x in u])


def _exact_shares(rng: np.random.Generator, n: int, shares: list[float]) -> np.ndarray:
    """Indices 0..len(shares)-1 for ``n`` items, each index as often as its share
    gives (largest remainders round), in random order."""
    raw = np.asarray(shares) * n
    counts = np.floor(raw).astype(int)
    for k in np.argsort(-(raw - counts), kind="stable")[: n - int(counts.sum())]:
        counts[k] += 1
    return np.asarray(rng.permutation(np.repeat(np.arange(len(shares)), counts)))


def generate_functions(
    n: int,
    rng: np.random.Generator,
    *,
    gpu_share: float = GPU_SHARE,
    model_loads: dict[str, llm_functions.ModelLoads] | None = None,
    id_hex: int = 16,
) -> list[FunctionProfile]:
    """``n`` functions drawn from the module's distributions (daily invocations,
    execution time and memory by Latin hypercube sampling; arrival classes and GPU
    functions in their exact shares, rounded); ``model_loads`` (default: read from
    the ServerlessLLM data) gives the GPU functions' service times.
    ``id_hex`` hex digits per app and function id (the Azure trace uses 64)."""
    if n < 1:
        raise ValueError(f"n: at least one function, not {n}")
    if not 0.0 <= gpu_share <= 1.0:
        raise ValueError(f"gpu_share: a share in [0, 1], not {gpu_share}")
    if gpu_share > 0 and model_loads is None:
        model_loads = llm_functions.read_model_loads(llm_functions.load_times_path())
    half = DAILY_SPAN_DECADES / 2
    log_daily = np.clip(
        _stratified_normal(rng, n, LOG10_DAILY_MEAN, LOG10_DAILY_SIGMA),
        LOG10_DAILY_MEAN - half,
        LOG10_DAILY_MEAN + half,
    )
    classes = _exact_shares(rng, n, [CLASS_SHARES[c] for c in ARRIVAL_CLASSES])
    is_gpu = np.zeros(n, dtype=bool)
    is_gpu[rng.permutation(n)[: round(gpu_share * n)]] = True
    exec_s = np.clip(
        np.exp(_stratified_normal(rng, n, EXEC_LN_MU, EXEC_LN_SIGMA)), EXEC_MIN_S, EXEC_MAX_S
    )
    memory = MEMORY_MEDIAN_MB * np.exp(_stratified_normal(rng, n, 0.0, MEMORY_LN_SIGMA))
    names = list(llm_functions.MODELS)
    model_idx = rng.integers(0, len(names), size=n)
    out: list[FunctionProfile] = []
    seen: set[tuple[str, str]] = set()
    for i in range(n):
        app, func = _hexid(rng, id_hex), _hexid(rng, id_hex)
        while (app, func) in seen:
            app = _hexid(rng, id_hex)
        seen.add((app, func))
        arrival = ARRIVAL_CLASSES[int(classes[i])]
        daily = float(10.0 ** log_daily[i])
        if is_gpu[i]:
            assert model_loads is not None
            model = names[int(model_idx[i])]
            loads = model_loads[model]
            warm_gb = 2.0 * loads.params_b + llm_functions.KV_GB
            out.append(
                FunctionProfile(
                    app, func, "gpu", arrival, daily, loads.service_s, warm_gb * 1024.0, model
                )
            )
        else:
            out.append(
                FunctionProfile(
                    app, func, "cpu", arrival, daily, float(exec_s[i]), float(memory[i])
                )
            )
    return out


def diurnal_multiplier(t_s: np.ndarray, start_hour: float = 0.0) -> np.ndarray:
    """Rate multiplier at trace times ``t_s`` (s): a sinusoid over the day with mean 1
    and peak/trough DIURNAL_PEAK_TO_TROUGH, peaking at DIURNAL_PEAK_HOUR; the trace
    starts at ``start_hour`` o'clock."""
    a = (DIURNAL_PEAK_TO_TROUGH - 1.0) / (DIURNAL_PEAK_TO_TROUGH + 1.0)
    phase = 2.0 * math.pi * ((t_s + start_hour * 3600.0) / DAY_S - DIURNAL_PEAK_HOUR / 24.0)
    return np.asarray(1.0 + a * np.cos(phase))


def _cumulative_multiplier(t_s: np.ndarray, start_hour: float) -> np.ndarray:
    """Integral of ``diurnal_multiplier`` from 0 to each of ``t_s``, s."""
    a = (DIURNAL_PEAK_TO_TROUGH - 1.0) / (DIURNAL_PEAK_TO_TROUGH + 1.0)
    w = 2.0 * math.pi / DAY_S
    phi = 2.0 * math.pi * (start_hour / 24.0 - DIURNAL_PEAK_HOUR / 24.0)
    return np.asarray(t_s + a / w * (np.sin(w * t_s + phi) - math.sin(phi)))


def _unit_gaps(rng: np.random.Generator, arrival: ArrivalClass, size: int) -> np.ndarray:
    """Inter-arrival times with mean 1 of the class's renewal process."""
    if arrival == "poisson":
        return rng.exponential(1.0, size=size)
    k = BURSTY_WEIBULL_SHAPE
    return rng.weibull(k, size=size) / math.gamma(1.0 + 1.0 / k)


def _arrivals(
    profile: FunctionProfile, horizon_s: float, rng: np.random.Generator, start_hour: float
) -> np.ndarray:
    """Arrival times in [0, horizon_s) of one function, s, sorted."""
    rate = profile.daily_invocations / DAY_S
    if profile.arrival == "timer":
        period = 1.0 / rate
        first = rng.uniform(0.0, period)
        times = first + period * np.arange(max(0, math.ceil((horizon_s - first) / period)))
        times = times + rng.normal(0.0, min(TIMER_JITTER_S, 0.01 * period), size=len(times))
        times = np.sort(times)
        return times[(times >= 0.0) & (times < horizon_s)]
    # A renewal process in operational time (expected count so far), mapped back
    # through the diurnal rate; it starts 10 mean gaps early so t = 0 is not a renewal.
    grid = np.linspace(0.0, horizon_s, max(2, int(horizon_s // 10.0) + 2))
    op = rate * _cumulative_multiplier(grid, start_hour)
    total = float(op[-1])
    warm = 10.0
    # Draws for six standard deviations of the count (CV 1 or the bursty 2.24); more
    # are drawn in the rare case they fall short.
    cv = 1.0 if profile.arrival == "poisson" else 2.3
    size = int(total + warm + 6.0 * cv * math.sqrt(total + warm) + 20)
    epochs = -warm + np.cumsum(_unit_gaps(rng, profile.arrival, size))
    while epochs[-1] < total:
        more = epochs[-1] + np.cumsum(_unit_gaps(rng, profile.arrival, size))
        epochs = np.concatenate([epochs, more])
    epochs = epochs[(epochs >= 0.0) & (epochs < total)]
    return np.asarray(np.interp(epochs, op, grid))


def _durations(
    profile: FunctionProfile,
    n: int,
    rng: np.random.Generator,
    model_loads: dict[str, llm_functions.ModelLoads] | None,
) -> np.ndarray:
    """Execution time of ``n`` invocations, s, rounded to the trace's 1 ms."""
    if profile.kind == "gpu":
        assert model_loads is not None
        samples = np.asarray(model_loads[profile.model].service_samples_s)
        d = rng.choice(samples, size=n)
    else:
        s = INVOCATION_LN_SIGMA
        d = profile.mean_duration_s * np.exp(rng.normal(-s * s / 2.0, s, size=n))
    return np.asarray(np.round(np.clip(d, EXEC_MIN_S, EXEC_MAX_S), 3))


def start_order(end_s: np.ndarray, duration_s: np.ndarray) -> np.ndarray:
    """Indices that order invocations by start (end - duration), then by end."""
    return np.lexsort((end_s, end_s - duration_s))


def generate_trace(
    profiles: list[FunctionProfile],
    horizon_s: float,
    rng: np.random.Generator,
    *,
    start_hour: float = 0.0,
    model_loads: dict[str, llm_functions.ModelLoads] | None = None,
) -> InvocationTrace:
    """Invocations of ``profiles`` over ``horizon_s`` seconds starting at
    ``start_hour`` o'clock: timers periodic with jitter, the others renewal processes
    under the diurnal rate; end timestamps and durations rounded to 1 ms."""
    if not horizon_s > 0:
        raise ValueError(f"horizon_s: a positive horizon, not {horizon_s}")
    if model_loads is None and any(p.kind == "gpu" for p in profiles):
        model_loads = llm_functions.read_model_loads(llm_functions.load_times_path())
    out = []
    for p in profiles:
        start = _arrivals(p, horizon_s, rng, start_hour)
        dur = _durations(p, len(start), rng, model_loads)
        end = np.round(start + dur, 3)
        order = start_order(end, dur)
        out.append(FunctionTrace(p.app, p.func, end[order], dur[order]))
    return InvocationTrace(tuple(out), horizon_s)


def generate(
    n: int,
    horizon_s: float,
    seed: int,
    *,
    gpu_share: float = GPU_SHARE,
    start_hour: float = 0.0,
    id_hex: int = 16,
) -> tuple[list[FunctionProfile], InvocationTrace]:
    """``n`` functions and their trace over ``horizon_s`` s from one seed."""
    rng = np.random.default_rng(seed)
    loads = (
        llm_functions.read_model_loads(llm_functions.load_times_path()) if gpu_share > 0 else None
    )
    profiles = generate_functions(n, rng, gpu_share=gpu_share, model_loads=loads, id_hex=id_hex)
    trace = generate_trace(profiles, horizon_s, rng, start_hour=start_hour, model_loads=loads)
    return profiles, trace


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(np.sort(times))
    m = float(gaps.mean())
    return float(gaps.std() / m) if m > 0 else 0.0


@dataclass(frozen=True)
class WorkloadStatistics:
    """What a trace shows of the module's targets."""

    functions: int
    invocations: int
    share_at_most_hourly: float
    """Functions invoked at most 24 times a day (at the trace's rate)."""
    share_at_most_per_minute: float
    """Functions invoked at most 1,440 times a day."""
    decades_expected: float
    """log10 of the largest over the smallest expected daily invocations."""
    decades_observed: float
    """log10 of the largest over the smallest observed daily rate (invoked ones)."""
    median_cv: dict[str, float]
    """Median inter-arrival CV per arrival class (functions with 20+ invocations)."""
    diurnal_peak_to_trough: float | None
    """Busiest over quietest hour of the mean per-function hourly profile (non-timer
    functions with 48+ invocations); None for a horizon under a day."""
    median_duration_s: float
    """Median over CPU functions of their mean observed execution time, s."""
    share_duration_under_1s: float
    """CPU functions whose mean observed execution time is under 1 s."""
    median_memory_mb: float
    """Median memory of the CPU functions, MB."""
    share_memory_at_most_400mb: float
    """CPU functions with at most 400 MB."""
    gpu_share: float
    """Share of GPU functions."""


def workload_statistics(
    profiles: list[FunctionProfile], trace: InvocationTrace
) -> WorkloadStatistics:
    """Measure the targeted statistics on a trace of ``profiles``."""
    known = trace.by_key()
    by_key = {
        (p.app, p.func): known.get((p.app, p.func)) or trace.of(p.app, p.func) for p in profiles
    }
    days = trace.horizon_s / DAY_S
    counts = np.array([len(by_key[(p.app, p.func)].end_s) for p in profiles], dtype=float)
    daily = counts / days
    invoked = daily[counts > 0]
    expected = np.array([p.daily_invocations for p in profiles])
    cvs: dict[str, list[float]] = {c: [] for c in ARRIVAL_CLASSES}
    for p in profiles:
        ft = by_key[(p.app, p.func)]
        if len(ft.end_s) >= 20:
            cvs[p.arrival].append(_cv(ft.start_s))
    diurnal = None
    if trace.horizon_s >= DAY_S:
        hours = int(trace.horizon_s // 3600)
        profile_sum = np.zeros(24)
        used = 0
        for p in profiles:
            ft = by_key[(p.app, p.func)]
            if p.arrival == "timer" or len(ft.end_s) < 48:
                continue
            start = ft.start_s
            start = start[(start >= 0) & (start < hours * 3600)]
            h = np.bincount((start // 3600).astype(int) % 24, minlength=24).astype(float)
            if h.sum() > 0:
                profile_sum += h / h.mean()
                used += 1
        if used:
            diurnal = float(profile_sum.max() / max(profile_sum.min(), 1e-12))
    cpu = [p for p in profiles if p.kind == "cpu"]
    mean_d = np.array(
        [
            float(by_key[(p.app, p.func)].duration_s.mean())
            for p in cpu
            if len(by_key[(p.app, p.func)].end_s)
        ]
    )
    memory = np.array([p.memory_mb for p in cpu])
    return WorkloadStatistics(
        functions=len(profiles),
        invocations=trace.invocations,
        share_at_most_hourly=float(np.mean(daily <= 24.0)),
        share_at_most_per_minute=float(np.mean(daily <= 1440.0)),
        decades_expected=float(np.log10(expected.max() / expected.min())),
        decades_observed=float(np.log10(invoked.max() / invoked.min())) if len(invoked) else 0.0,
        median_cv={c: float(np.median(v)) if v else math.nan for c, v in cvs.items()},
        diurnal_peak_to_trough=diurnal,
        median_duration_s=float(np.median(mean_d)) if len(mean_d) else math.nan,
        share_duration_under_1s=float(np.mean(mean_d < 1.0)) if len(mean_d) else math.nan,
        median_memory_mb=float(np.median(memory)) if len(memory) else math.nan,
        share_memory_at_most_400mb=float(np.mean(memory <= 400.0)) if len(memory) else math.nan,
        gpu_share=float(np.mean([p.kind == "gpu" for p in profiles])),
    )


def window_counts(ft: FunctionTrace, window_s: float, windows: int) -> list[int]:
    """Invocations of one function starting in each window (starts before 0 or after
    the last window are left out)."""
    idx = np.floor(ft.start_s / window_s).astype(int)
    idx = idx[(idx >= 0) & (idx < windows)]
    return [int(c) for c in np.bincount(idx, minlength=windows)]


def function_name(p: FunctionProfile) -> str:
    """A keep-alive function's name: its kind (the model for a GPU function), the
    first 8 hex digits of its app and of its function id."""
    head = p.model if p.kind == "gpu" else "cpu"
    return f"{head}-{p.app[:8]}-{p.func[:8]}"


def cpu_function_states(p: FunctionProfile, service_s: float) -> dict[str, Any]:
    """``warm``, ``cold_start`` and ``service`` of a CPU function (no tepid state):
    warm it holds its memory in host DRAM at llm_functions.DRAM_W_PER_GB; a cold
    start takes CPU_COLD_START_S at llm_functions.HOST_LOAD_W; it runs at
    CPU_SERVICE_W (assumptions)."""
    gb = p.memory_mb / 1024.0
    return {
        "warm": {
            "gpu_memory_gb": 0.0,
            "host_memory_gb": round(gb, 3),
            "power_w": round(llm_functions.DRAM_W_PER_GB * gb, 4),
        },
        "cold_start": {
            "time_s": CPU_COLD_START_S,
            "energy_j": round(CPU_COLD_START_S * llm_functions.HOST_LOAD_W, 1),
        },
        "service": {"time_s": round(max(service_s, EXEC_MIN_S), 3), "power_w": CPU_SERVICE_W},
    }


REPLICA_POWER_SHARE = 0.5
"""A function whose busiest window needs more than this share of a node's power
budget is split into replicas (assumption: the platform scales a busy function out
to several containers, each taking an equal share of its invocations)."""
NODE_FILL = 0.6
"""With ``nodes=None`` the instance has enough nodes that the functions' busiest
windows together fill at most this share of their power budgets (assumption)."""


def _window_power_w(fn: dict[str, Any], window_s: float) -> float:
    """A keep-alive function's power in its busiest window if warm throughout, W."""
    peak = max(fn["arrivals"]) if fn["arrivals"] else 0
    service = fn["service"]
    return float(fn["warm"]["power_w"] + peak * service["time_s"] * service["power_w"] / window_s)


def _replicas(fn: dict[str, Any], window_s: float, node_power_w: float) -> list[dict[str, Any]]:
    """``fn`` split into replicas of at most REPLICA_POWER_SHARE of a node's budget
    each (itself where it fits); window k's invocations go to the replicas in turn."""
    r = max(1, math.ceil(_window_power_w(fn, window_s) / (REPLICA_POWER_SHARE * node_power_w)))
    if r == 1:
        return [fn]
    out = []
    for k in range(r):
        counts = [c // r + (1 if k < c % r else 0) for c in fn["arrivals"]]
        out.append({**fn, "name": f"{fn['name']}-r{k}", "arrivals": counts})
    return out


def keepalive_instance(
    profiles: list[FunctionProfile],
    trace: InvocationTrace,
    *,
    name: str,
    window_s: float = 300.0,
    windows: int | None = None,
    nodes: int | None = None,
    node_host_gb: float = NODE_HOST_GB,
    node_power_w: float = NODE_POWER_W,
    start_latency_s: float = 15.0,
    percentile: float = 99.0,
    model_loads: dict[str, llm_functions.ModelLoads] | None = None,
    description: str = "",
) -> dict[str, Any]:
    """A ``kind: keepalive`` document: every profile a function with its per-window
    invocation counts from ``trace`` (split into replicas where one node could not
    carry it, REPLICA_POWER_SHARE), on ``nodes`` one-H100 nodes (None: enough for
    NODE_FILL). GPU functions take their states from ``llm_functions``; CPU
    functions ``cpu_function_states`` with their mean traced execution time (the
    profile's mean where not invoked)."""
    if windows is None:
        windows = max(1, int(trace.horizon_s // window_s))
    if model_loads is None and any(p.kind == "gpu" for p in profiles):
        model_loads = llm_functions.read_model_loads(llm_functions.load_times_path())
    by_key = trace.by_key()
    functions = []
    for p in profiles:
        ft = by_key.get((p.app, p.func)) or trace.of(p.app, p.func)
        if p.kind == "gpu":
            assert model_loads is not None
            states = llm_functions.llm_function_states(model_loads[p.model])
        else:
            service = float(ft.duration_s.mean()) if len(ft.duration_s) else p.mean_duration_s
            states = cpu_function_states(p, service)
        fn = {"name": function_name(p), **states, "arrivals": window_counts(ft, window_s, windows)}
        functions.extend(_replicas(fn, window_s, node_power_w))
    if nodes is None:
        need = sum(_window_power_w(fn, window_s) for fn in functions)
        nodes = max(1, math.ceil(need / (NODE_FILL * node_power_w)))
    return {
        "kind": "keepalive",
        "name": name,
        "description": description,
        "window_s": window_s,
        "slo": {"start_latency_s": start_latency_s, "percentile": percentile},
        "objective": {"kind": "energy"},
        "nodes": [
            {
                "name": f"h100-{k}",
                "gpu_memory_gb": llm_functions.GPU_GB,
                "host_memory_gb": node_host_gb,
                "power_budget_w": node_power_w,
            }
            for k in range(nodes)
        ],
        "functions": functions,
    }
