"""A ``kind: moe-edge`` file bound to the catalog, and the expected cost of every
placement option of every expert under one configuration.

Items are the experts, numbered ``i = layer * E + expert``. Options are numbered
``o = g`` (resident on GPU g, for the G GPUs), ``FETCH = G`` (host memory, copied to
the dense GPU when used) and ``CPU = G + 1`` (host memory, run on the CPU). A
configuration fixes the GPU that holds the dense part and every GPU's SM clock;
under it every option's expected time, variance and energy per decode step are
constants, so the placement is a linear 0/1 program (``milp.py``). Times are ms,
energies J (per decode step unless named per token), memory GB.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.loader import Catalog, bind_catalog, builtin_catalog
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan, memory_limit_gb
from energyopt.perf.clocks import candidate_clocks_mhz
from energyopt.perf.kernels import kernel_costs
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import parse, read_data
from energyopt.spec.llm import LlmModel

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

DEFAULT_CLOCKS = 3
"""Clocks considered per GPU when a file lists none."""
EXPERT_LAUNCH_MS = 0.01
"""Fixed cost of one expert FFN on a GPU at the max clock (three GEMM launches), ms;
an assumption (docs/formulations/moe-edge.md, §6)."""
COSTS_KEPT = 256
"""Configurations whose option costs a problem keeps (least recently used dropped)."""
FREQUENCY_SUM_TOL = 0.02
"""Relative tolerance of a layer's shares summing to top-k."""


def expert_params(model: LlmModel) -> float:
    """Parameters of one SwiGLU expert: gate, up and down projections."""
    return 3.0 * model.hidden_size * model.intermediate_size


def dense_params(model: LlmModel) -> float:
    """Parameters outside the experts (attention, norms, routers, embeddings)."""
    return model.params_total_b * 1e9 - model.layers * model.experts * expert_params(model)


def cantelli_factor(percentile: float) -> float:
    """k with P(X >= mean + k sd) <= 1 - p for every distribution (Cantelli)."""
    p = percentile / 100.0
    return float(np.sqrt(p / (1.0 - p)))


@dataclass(frozen=True)
class Config:
    """The GPU holding the dense part and each GPU's SM clock (MHz)."""

    dense: int
    clocks: tuple[int, ...]


@dataclass(frozen=True)
class ConfigCosts:
    """Expected costs of every (item, option) under one configuration (inf: option
    unavailable). Per decode step of ``batch`` tokens."""

    config: Config
    time_ms: FloatArray
    """(I, O) expected time the item adds to a step."""
    var_ms2: FloatArray
    """(I, O) variance of that time, ms^2 (the item's hit is a Bernoulli draw)."""
    energy_j: FloatArray
    """(I, O) expected energy, J: the work's dynamic energy, transfers, and the
    server's static power over the time it adds."""
    prefill_ms: FloatArray
    """(I, O) expected time the item adds to the prefill of one prompt."""
    dense_ms: float
    dense_j: float
    dense_prefill_ms: float
    static_w: float
    """Power of the server while on at these clocks: GPUs' on-power, CPU idle, base."""
    gpu_free_gb: FloatArray
    """(G,) GPU memory left for resident experts (negative: the dense part does not fit)."""
    pair_save_ms: FloatArray
    """(P,) time a co-activated pair saves per step when both sit on one remote device."""


@dataclass(frozen=True)
class MoeEdgeProblem:
    """A bound MoE edge instance: L layers x E experts on G GPUs."""

    spec: MoeEdgeFile
    source: str
    model: LlmModel
    gpus: tuple[GpuType, ...]
    freq: FloatArray
    """(L, E) share of tokens selecting each expert."""
    clock_options: tuple[tuple[int, ...], ...]
    """Per GPU, the SM clocks considered (MHz)."""
    pair_a: IntArray
    pair_b: IntArray
    pair_q: FloatArray
    """Co-activated pairs (items a, b) of one layer and the share of tokens selecting both."""
    _costs: dict[Config, ConfigCosts] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_layers(self) -> int:
        return int(self.freq.shape[0])

    @property
    def n_experts(self) -> int:
        return int(self.freq.shape[1])

    @property
    def n_items(self) -> int:
        return self.n_layers * self.n_experts

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def fetch(self) -> int:
        return self.n_gpus

    @property
    def cpu(self) -> int:
        return self.n_gpus + 1

    @property
    def n_options(self) -> int:
        return self.n_gpus + 2

    @property
    def expert_gb(self) -> float:
        return expert_params(self.model) * self.model.bytes_per_param / 1e9

    @property
    def kappa(self) -> float:
        return cantelli_factor(self.spec.slo.percentile)

    def configs(self) -> list[Config]:
        """Every configuration: dense GPU x one clock per GPU."""
        out = []
        for d in range(self.n_gpus):
            for clocks in itertools.product(*self.clock_options):
                out.append(Config(d, tuple(int(c) for c in clocks)))
        return out

    def gpu_classes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(class of each GPU off the dense part, class of each GPU as the dense one).

        Two GPUs that do not hold the dense part are interchangeable when they have
        one type, one memory and one list of clocks (nothing else of theirs enters a
        cost: their link carries no fetch and every hop costs ``hop_ms``); as the
        dense GPU, the link's bandwidth must match too."""
        keys: list[tuple[object, ...]] = []
        for g, gpu in zip(self.spec.server.gpus, self.gpus, strict=True):
            mem = g.memory_gb if g.memory_gb is not None else gpu.memory_gb
            keys.append((gpu.name, float(mem), self.clock_options[len(keys)]))
        off = tuple(keys.index(k) for k in keys)
        full = [(*k, float(g.pcie_gbps)) for k, g in zip(keys, self.spec.server.gpus, strict=True)]
        return off, tuple(full.index(k) for k in full)

    def n_configs(self) -> int:
        """How many configurations ``configs()`` lists."""
        return self.n_gpus * math.prod(len(c) for c in self.clock_options)

    def _classes_off(self, dense: int) -> dict[int, list[int]]:
        off, _ = self.gpu_classes()
        members: dict[int, list[int]] = {}
        for g in range(self.n_gpus):
            if g != dense:
                members.setdefault(off[g], []).append(g)
        return members

    def n_canonical_configs(self) -> int:
        """How many configurations ``iter_canonical_configs()`` yields (counted, not
        listed: 8 GPUs with 64 clocks each have about 2e15 configurations)."""
        _, dense_class = self.gpu_classes()
        total = 0
        for d in range(self.n_gpus):
            if dense_class[d] == d:
                n = len(self.clock_options[d])
                for gs in self._classes_off(d).values():
                    c = len(self.clock_options[gs[0]])
                    n *= math.comb(len(gs) + c - 1, len(gs))
                total += n
        return total

    def iter_canonical_configs(self) -> Iterator[Config]:
        """One configuration of each class of equivalent ones, lazily: the dense part
        only on the first GPU of each group of identical GPUs, and the clocks of
        interchangeable GPUs off the dense part in non-increasing order by index.
        Relabelling interchangeable GPUs maps every plan of a configuration left out
        to a plan of one kept with the same costs, so the optimum over these is the
        optimum over ``configs()``."""
        _, dense_class = self.gpu_classes()
        for d in range(self.n_gpus):
            if dense_class[d] != d:
                continue
            groups = list(self._classes_off(d).values())
            for dclk in self.clock_options[d]:
                clocks = [0] * self.n_gpus
                clocks[d] = int(dclk)
                yield from self._fill(d, groups, 0, clocks)

    def _fill(
        self, dense: int, groups: list[list[int]], k: int, clocks: list[int]
    ) -> Iterator[Config]:
        """Every non-increasing choice of clocks for groups ``k``.. (lazily: a group of
        7 GPUs with 64 clocks has 1.2e9 choices)."""
        if k == len(groups):
            yield Config(dense, tuple(clocks))
            return
        gs = groups[k]
        options = sorted(self.clock_options[gs[0]], reverse=True)
        for pick in itertools.combinations_with_replacement(options, len(gs)):
            for g, clk in zip(gs, pick, strict=True):
                clocks[g] = int(clk)
            yield from self._fill(dense, groups, k + 1, clocks)

    def canonical_configs(self) -> list[Config]:
        """``iter_canonical_configs()`` as a list (for instances where it is short)."""
        return list(self.iter_canonical_configs())

    def max_clock_config(self, dense: int = 0) -> Config:
        return Config(dense, tuple(max(c) for c in self.clock_options))

    def costs(self, config: Config) -> ConfigCosts:
        """The option costs under ``config`` (computed once, then kept while among the
        ``COSTS_KEPT`` most recently used: a server of 8 GPUs has 52,488
        configurations, too many to keep)."""
        found = self._costs.pop(config, None)
        if found is None:
            found = config_costs(self, config)
        self._costs[config] = found
        while len(self._costs) > COSTS_KEPT:
            del self._costs[next(iter(self._costs))]
        return found

    @cached_property
    def host_gb_free(self) -> float:
        return memory_limit_gb(float(self.spec.server.host_memory_gb))

    def plan_of(self, config: Config, choice: IntArray) -> MoeEdgePlan:
        """The plan file model of an (I,) array of options under ``config``."""
        names = [g.name for g in self.spec.server.gpus]
        labels = [*names, "fetch", "cpu"]
        grid = np.asarray(choice, dtype=np.int64).reshape(self.n_layers, self.n_experts)
        return MoeEdgePlan(
            name=self.spec.name,
            dense_gpu=names[config.dense],
            clocks_mhz={n: int(c) for n, c in zip(names, config.clocks, strict=True)},
            placement=tuple(tuple(labels[int(o)] for o in row) for row in grid),
            objective_unit=objective_unit(self.spec),
        )

    def choice_of(self, plan: MoeEdgePlan) -> tuple[Config, IntArray]:
        """(config, options) of a plan that has passed the verifier."""
        names = [g.name for g in self.spec.server.gpus]
        labels = {n: i for i, n in enumerate([*names, "fetch", "cpu"])}
        config = Config(names.index(plan.dense_gpu), tuple(plan.clocks_mhz[n] for n in names))
        choice = np.array([labels[x] for row in plan.placement for x in row], dtype=np.int64)
        return config, choice


def objective_unit(spec: MoeEdgeFile) -> str:
    return "J/token" if spec.objective.kind == "energy" else "ms/token"


def load_moe_edge(path: str | Path, extra_catalogs: Sequence[str | Path] = ()) -> MoeEdgeProblem:
    """Read, validate and bind a moe-edge file; SpecError naming file and field."""
    p = Path(path)
    spec = parse(MoeEdgeFile, read_data(p), str(p))
    catalog, problems = bind_catalog(extra=extra_catalogs)
    if problems:
        raise SpecError(problems)
    return build_problem(spec, str(p), catalog)


def build_problem(
    spec: MoeEdgeFile, source: str = "<moe-edge>", catalog: Catalog | None = None
) -> MoeEdgeProblem:
    """Bind a parsed file to the catalog; SpecError listing every problem found."""
    cat = catalog or builtin_catalog()
    problems: list[str] = []
    try:
        model = cat.model(spec.model)
    except KeyError as exc:
        raise SpecError([f"{source}: model: {exc.args[0]}"]) from None
    if model.experts < 2:
        raise SpecError([f"{source}: model: {model.name} is dense (experts: {model.experts})"])
    gpus: list[GpuType] = []
    clock_options: list[tuple[int, ...]] = []
    for i, g in enumerate(spec.server.gpus):
        where = f"{source}: server.gpus[{i}]({g.name})"
        try:
            gpu = cat.gpu(g.type)
        except KeyError as exc:
            problems.append(f"{where}.type: {exc.args[0]}")
            continue
        gpus.append(gpu)
        if g.memory_gb is not None and g.memory_gb > gpu.memory_gb:
            problems.append(
                f"{where}.memory_gb: {g.memory_gb:g} GB exceeds the {gpu.name}'s "
                f"{gpu.memory_gb:g} GB"
            )
        supported = set(gpu.sm_clocks_mhz())
        bad = [c for c in g.clocks_mhz or () if c not in supported]
        if bad:
            problems.append(
                f"{where}.clocks_mhz: {bad} not supported by {gpu.name} "
                f"({gpu.min_sm_clock_mhz}..{gpu.max_sm_clock_mhz} MHz, "
                f"step {gpu.sm_clock_step_mhz})"
            )
        given = {gpu.name: g.clocks_mhz} if g.clocks_mhz else None
        clock_options.append(candidate_clocks_mhz(gpu, given, DEFAULT_CLOCKS))
    acts = spec.activations
    n_l, n_e, k = model.layers, model.experts, model.experts_per_token
    if len(acts.layers) != n_l:
        problems.append(
            f"{source}: activations.layers: {len(acts.layers)} layers given; {model.name} has {n_l}"
        )
    freq = np.zeros((n_l, n_e))
    for j, la in enumerate(acts.layers[:n_l]):  # more layers than the model: reported above
        where = f"{source}: activations.layers[{j}]"
        if la.layer != j:
            problems.append(f"{where}.layer: {la.layer}; layers must be listed in order from 0")
            continue
        if len(la.frequencies) != n_e:
            problems.append(
                f"{where}.frequencies: {len(la.frequencies)} shares; {model.name} has {n_e} experts"
            )
            continue
        total = sum(la.frequencies)
        if abs(total - k) > FREQUENCY_SUM_TOL * k:
            problems.append(
                f"{where}.frequencies: shares sum to {total:.4g}; each token selects "
                f"{k} experts, so they must sum to {k}"
            )
            continue
        freq[j] = np.asarray(la.frequencies) * (k / total)
    pa, pb, pq = [], [], []
    for j, ca in enumerate(acts.co_activation):
        where = f"{source}: activations.co_activation[{j}]"
        ok = True
        for name, (lay, ex) in (("a", ca.a), ("b", ca.b)):
            if not (0 <= lay < n_l and 0 <= ex < n_e):
                problems.append(f"{where}.{name}: ({lay}, {ex}) is no expert of {model.name}")
                ok = False
        if not ok:
            continue
        if ca.a[0] != ca.b[0] or ca.a[1] == ca.b[1]:
            problems.append(f"{where}: a and b must be two experts of one layer")
            continue
        pa.append(ca.a[0] * n_e + ca.a[1])
        pb.append(ca.b[0] * n_e + ca.b[1])
        pq.append(ca.probability)
    slo = spec.slo
    if spec.context_tokens > model.max_context:
        problems.append(
            f"{source}: context_tokens: {spec.context_tokens} exceeds {model.name}'s context "
            f"of {model.max_context}"
        )
    if slo.prompt_tokens > model.max_context:
        problems.append(
            f"{source}: slo.prompt_tokens: {slo.prompt_tokens} exceeds {model.name}'s context "
            f"of {model.max_context}"
        )
    if problems:
        raise SpecError(problems)
    return MoeEdgeProblem(
        spec=spec,
        source=source,
        model=model,
        gpus=tuple(gpus),
        freq=freq,
        clock_options=tuple(clock_options),
        pair_a=np.asarray(pa, dtype=np.int64),
        pair_b=np.asarray(pb, dtype=np.int64),
        pair_q=np.asarray(pq, dtype=np.float64),
    )


def _kernel(
    gpu: GpuType, clock_mhz: int, flops: FloatArray, nbytes: FloatArray, launch_ms: float
) -> tuple[FloatArray, FloatArray]:
    """(ms, dynamic J) of kernels on ``gpu`` at ``clock_mhz``: the catalog's roofline
    and power model (``kernel_costs``), less the GPU's on-power (paid as static)."""
    n = len(flops)
    ms, active_w = kernel_costs(
        gpu, np.full(n, float(clock_mhz)), flops, nbytes, np.ones(n), np.full(n, launch_ms)
    )
    dyn_w = np.maximum(active_w - gpu_on_power_w(gpu, clock_mhz), 0.0)
    return ms, dyn_w * ms / 1e3


def used_probability(freq: FloatArray, tokens: int) -> FloatArray:
    """1 - (1 - freq)^tokens, computed as -expm1(tokens * log1p(-freq)): the plain form
    rounds to 0 below a frequency of about 1e-16 and loses digits well above it. A
    frequency scaled to 1 or above keeps the plain form."""
    f = np.asarray(freq, dtype=np.float64)
    below = f < 1.0
    stable = -np.expm1(tokens * np.log1p(-np.where(below, f, 0.0)))
    return np.asarray(np.where(below, stable, 1.0 - np.power(1.0 - f, tokens)))


def _hits(freq: FloatArray, tokens: int) -> tuple[FloatArray, FloatArray]:
    """(probability an expert is used by at least one of ``tokens`` tokens, the tokens
    it then serves on average), with tokens routed independently."""
    hit = used_probability(freq, tokens)
    # the served tokens tend to 1 as the frequency does to 0
    served = np.where(hit > 0, tokens * freq / np.maximum(hit, 1e-300), 1.0)
    return hit, served


def config_costs(p: MoeEdgeProblem, c: Config) -> ConfigCosts:
    spec, model = p.spec, p.model
    server = spec.server
    n_i = p.n_items
    d = c.dense
    w_gb = p.expert_gb
    w_bytes = w_gb * 1e9
    flops_tok = 2.0 * expert_params(model)
    static_w = (
        sum(gpu_on_power_w(g, clk) for g, clk in zip(p.gpus, c.clocks, strict=True))
        + server.cpu.idle_w
        + server.base_w
    )
    freq = p.freq.ravel()
    time = np.full((n_i, p.n_options), np.inf)
    var = np.full((n_i, p.n_options), np.inf)
    energy = np.full((n_i, p.n_options), np.inf)
    prefill = np.full((n_i, p.n_options), np.inf)
    cpu = server.cpu
    cpu_dyn_w = cpu.active_w - cpu.idle_w
    pcie_j = w_bytes * 8.0 * server.pcie_pj_per_bit * 1e-12
    fetch_ms = w_bytes / (server.gpus[d].pcie_gbps * 1e9) * 1e3
    for phase, tokens in (("decode", spec.batch), ("prefill", spec.slo.prompt_tokens)):
        hit, served = _hits(freq, tokens)
        hit_ms = np.zeros((n_i, p.n_options))
        dyn_j = np.zeros((n_i, p.n_options))
        for g, gpu in enumerate(p.gpus):
            ms, j = _kernel(
                gpu, c.clocks[g], flops_tok * served, np.full(n_i, w_bytes), EXPERT_LAUNCH_MS
            )
            hop = 0.0 if g == d else 2.0 * server.hop_ms
            hit_ms[:, g] = ms + hop
            dyn_j[:, g] = j
            if g == d:
                hit_ms[:, p.fetch] = ms + fetch_ms
                dyn_j[:, p.fetch] = j + pcie_j
        cpu_ms = (
            np.maximum(
                flops_tok * served / (cpu.expert_gflops * 1e9),
                w_bytes / (cpu.memory_bandwidth_gbps * 1e9),
            )
            * 1e3
        )
        hit_ms[:, p.cpu] = cpu_ms + 2.0 * server.hop_ms
        dyn_j[:, p.cpu] = cpu_dyn_w * cpu_ms / 1e3
        if phase == "decode":
            time = hit[:, None] * hit_ms
            var = hit[:, None] * (1.0 - hit[:, None]) * hit_ms**2
            energy = hit[:, None] * dyn_j + static_w * time / 1e3
        else:
            prefill = hit[:, None] * hit_ms
    dense = dense_params(model)
    attn = model.heads * model.head_dim_eff
    b, ctx, prompt = spec.batch, spec.context_tokens, spec.slo.prompt_tokens
    dense_bytes = dense * model.bytes_per_param
    gd = p.gpus[d]
    dec_ms, dec_j = _kernel(
        gd,
        c.clocks[d],
        np.array([2.0 * dense * b + 4.0 * model.layers * b * ctx * attn]),
        np.array([dense_bytes + b * ctx * model.kv_bytes_per_token]),
        gd.efficiency.step_overhead_ms,
    )
    pre_ms, _ = _kernel(
        gd,
        c.clocks[d],
        np.array([2.0 * dense * prompt + 2.0 * model.layers * prompt**2 * attn]),
        np.array([dense_bytes + prompt * model.kv_bytes_per_token]),
        gd.efficiency.step_overhead_ms,
    )
    free = np.array(
        [
            memory_limit_gb(own if (own := server.gpus[g].memory_gb) is not None else gpu.memory_gb)
            for g, gpu in enumerate(p.gpus)
        ],
        dtype=np.float64,
    )
    free[d] -= (
        dense_bytes / 1e9
        + b * ctx * model.kv_bytes_per_token / 1e9
        + spec.reserve_gb
        + spec.cache_experts * w_gb
    )
    q_step = used_probability(p.pair_q, spec.batch)
    return ConfigCosts(
        config=c,
        time_ms=time,
        var_ms2=var,
        energy_j=energy,
        prefill_ms=prefill,
        dense_ms=float(dec_ms[0]),
        dense_j=float(dec_j[0]) + static_w * float(dec_ms[0]) / 1e3,
        dense_prefill_ms=float(pre_ms[0]),
        static_w=float(static_w),
        gpu_free_gb=free,
        pair_save_ms=q_step * 2.0 * server.hop_ms,
    )


@dataclass(frozen=True)
class UseCosts:
    """Cost of one use of an expert (all experts have one shape) serving n tokens,
    per option, under one configuration: ``ms[o, n]`` and ``dyn_j[o, n]`` (energy
    above the server's static power), for n = 0 .. max tokens. A fetched expert
    found in the dense GPU's cache costs ``cached_ms`` / ``cached_j``; a fetch moves
    ``fetch_bytes``."""

    ms: FloatArray
    dyn_j: FloatArray
    cached_ms: FloatArray
    cached_j: FloatArray
    fetch_bytes: float


def use_costs(p: MoeEdgeProblem, config: Config, max_tokens: int) -> UseCosts:
    """Per-use costs for the token-level simulator (the same model as the planner's)."""
    server = p.spec.server
    d = config.dense
    w_bytes = p.expert_gb * 1e9
    flops_tok = 2.0 * expert_params(p.model)
    tokens = np.arange(max_tokens + 1, dtype=np.float64)
    ms = np.zeros((p.n_options, max_tokens + 1))
    dyn = np.zeros((p.n_options, max_tokens + 1))
    cached_ms = np.zeros(max_tokens + 1)
    cached_j = np.zeros(max_tokens + 1)
    pcie_j = w_bytes * 8.0 * server.pcie_pj_per_bit * 1e-12
    fetch_ms = w_bytes / (server.gpus[d].pcie_gbps * 1e9) * 1e3
    for g, gpu in enumerate(p.gpus):
        k_ms, k_j = _kernel(
            gpu,
            config.clocks[g],
            flops_tok * tokens,
            np.full(len(tokens), w_bytes),
            EXPERT_LAUNCH_MS,
        )
        ms[g] = k_ms + (0.0 if g == d else 2.0 * server.hop_ms)
        dyn[g] = k_j
        if g == d:
            cached_ms[:] = k_ms
            cached_j[:] = k_j
            ms[p.fetch] = k_ms + fetch_ms
            dyn[p.fetch] = k_j + pcie_j
    cpu = server.cpu
    cpu_ms = 1e3 * np.maximum(
        flops_tok * tokens / (cpu.expert_gflops * 1e9), w_bytes / (cpu.memory_bandwidth_gbps * 1e9)
    )
    ms[p.cpu] = cpu_ms + 2.0 * server.hop_ms
    dyn[p.cpu] = (cpu.active_w - cpu.idle_w) * cpu_ms / 1e3
    ms[:, 0] = 0.0
    dyn[:, 0] = 0.0
    cached_ms[0] = cached_j[0] = 0.0
    return UseCosts(ms, dyn, cached_ms, cached_j, w_bytes)
