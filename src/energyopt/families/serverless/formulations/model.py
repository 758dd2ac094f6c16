"""A serverless file bound to its catalog and evaluated on the performance model:
the arrays every serverless solver works on.

An *option* is one instance size and clock: (MPS share, TP size, SM clock); a TP
group takes whole GPUs (share 100). For every model and option the performance
model (perf/queueing.py, the serving family's SLO capacity of a phase) gives the
SLO capacity of a decode instance and of a prefill instance whose KV caches go
over NVLink or over the network: the prefill's TTFT budget is the SLO less the
KV transfer (perf/kvtransfer.py). Capacities are requests/s, energies J, powers W,
times s, GPU amounts in GPUs (a 25 % share is 0.25).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.loader import bind_catalog
from energyopt.families.serverless.spec import (
    LinkKind,
    LinkSpec,
    Pool,
    ServerlessFile,
    ServerlessPlan,
)
from energyopt.perf.clocks import CLOCK_RANGE_FLOOR, spread_clocks_mhz
from energyopt.perf.coldstart import load_time_s
from energyopt.perf.energy import energy_per_request_j
from energyopt.perf.kvtransfer import NETWORK_H100, NVLINK_H100, Link, kv_bytes
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import slo_capacity
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Options
from energyopt.spec.io import parse, read_data
from energyopt.spec.llm import LlmModel
from energyopt.spec.workload import Phase, Slo, Workload

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

LINKS: tuple[LinkKind, ...] = ("nvlink", "network")
NVLINK, NETWORK = 0, 1
DEFAULT_CLOCK_COUNT = 3
PERF_TABLES_KEPT = 32
_PERF_TABLES: dict[str, tuple[FloatArray, FloatArray]] = {}
"""Capacity and energy tables of the files bound so far in this process, by what
they depend on (GPU, models, options, links, token means and SLOs; not demand)."""


@dataclass(frozen=True)
class Option:
    """One instance size and clock."""

    share_pct: int
    tp: int
    clock_mhz: int

    @property
    def gpus(self) -> float:
        """GPUs the instance holds (a 25 % share: 0.25; TP 4: 4)."""
        return self.share_pct / 100.0 * self.tp


def option_name(opt: Option) -> str:
    """``share%/tpN/clockMHz``: an option's name (the rate table's ``option`` axis)."""
    return f"{opt.share_pct}%/tp{opt.tp}/{opt.clock_mhz}MHz"


@dataclass(frozen=True)
class ServerlessProblem:
    """A bound serverless instance: M models, N nodes, T epochs, O options."""

    spec: ServerlessFile
    source: str
    gpu: GpuType
    llms: tuple[LlmModel, ...]
    options: tuple[Option, ...]
    links: tuple[Link, Link]
    """(nvlink, network) links of KV-cache transfers."""
    demand: FloatArray
    """(M, T): mean requests/s per epoch."""
    cap_prefill: FloatArray
    """(M, O, 2): SLO capacity of one prefill instance by the link its KV goes over, rps
    (0: the option cannot serve the model's prefill within its SLO)."""
    cap_decode: FloatArray
    """(M, O): SLO capacity of one decode instance, rps."""
    energy_prefill: FloatArray
    """(M, O): dynamic energy of one request's prefill on the option, J."""
    energy_decode: FloatArray
    """(M, O): dynamic energy of one request's decode on the option, J."""
    on_w: FloatArray
    """(O,): on power of the instance's GPUs at its clock, its share of them, W."""
    load_s: FloatArray
    """(M, O): cold start of one instance, s."""
    kv_request_bytes: FloatArray
    """(M,): bytes of one request's prompt KV cache (the transfer)."""
    transfer_s: FloatArray
    """(M, 2): KV transfer time of one request over each link, s."""
    fits: NDArray[np.bool_]
    """(N, O): the option's GPUs fit in the node (tp <= the node's GPUs)."""
    node_gpus: FloatArray
    """(N,): GPUs per node."""
    nic_bps: FloatArray
    """(N,): network bandwidth of each node, each way, bytes/s."""
    power_cap_w: FloatArray
    """(N,): power cap of each node, W (inf: none)."""
    gpu_s_weight: float
    """Objective: weight of a GPU-second."""
    energy_weight: float
    """Objective: weight of a joule."""

    @property
    def n_models(self) -> int:
        return len(self.llms)

    @property
    def n_nodes(self) -> int:
        return int(self.node_gpus.shape[0])

    @property
    def n_epochs(self) -> int:
        return int(self.demand.shape[1])

    @property
    def n_options(self) -> int:
        return len(self.options)

    @property
    def epoch_s(self) -> float:
        return self.spec.epoch_s

    @property
    def unit(self) -> str:
        kind = self.spec.objective.kind
        return {"gpu_seconds": "GPU-s", "energy": "J", "weighted": "GPU-s + w J"}[kind]

    def gpus_of(self) -> FloatArray:
        """(O,): GPUs each option holds."""
        return np.array([o.gpus for o in self.options])

    def instance_cost(self, m: int) -> FloatArray:
        """(O,): objective of holding one instance of model m for an epoch (no requests)."""
        held = self.gpu_s_weight * self.gpus_of() + self.energy_weight * self.on_w
        return np.asarray(self.epoch_s * held, dtype=np.float64)

    def start_cost(self, m: int) -> FloatArray:
        """(O,): objective of one cold start of model m's instance (slice held while loading)."""
        held = self.gpu_s_weight * self.gpus_of() + self.energy_weight * self.on_w
        return np.asarray(self.load_s[m] * held, dtype=np.float64)

    def stop_cost(self, m: int) -> FloatArray:
        """(O,): objective of removing one decode instance of model m: it stays held
        for the model's drain time (``decode_drain_s``)."""
        held = self.gpu_s_weight * self.gpus_of() + self.energy_weight * self.on_w
        return np.asarray(self.spec.models[m].drain_s * held, dtype=np.float64)

    def serve_cost(self, m: int, phase: str) -> FloatArray:
        """(O,): objective of serving 1 request/s of model m for an epoch on the option."""
        e = self.energy_prefill[m] if phase == "prefill" else self.energy_decode[m]
        return np.asarray(self.epoch_s * self.energy_weight * e, dtype=np.float64)

    def plan_of(
        self, pools: list[list[Pool]], routes: list[list[tuple[int, int, int, float]]]
    ) -> ServerlessPlan:
        """The plan file model of per-epoch pools and (model, prefill node, decode node,
        rate) routes."""
        from energyopt.families.serverless.spec import EpochPlan, Route

        names = [n.name for n in self.spec.nodes]
        models = [m.name for m in self.spec.models]
        return ServerlessPlan(
            name=self.spec.name,
            epochs=tuple(
                EpochPlan(
                    epoch=t,
                    pools=tuple(pools[t]),
                    routes=tuple(
                        Route(
                            model=models[m],
                            prefill_node=names[a],
                            decode_node=names[b],
                            rate_rps=rate,
                        )
                        for m, a, b, rate in routes[t]
                    ),
                )
                for t in range(len(pools))
            ),
            objective_unit=self.unit,
        )


def load_serverless(
    path: str | Path, catalogs: tuple[str, ...] | list[str] = ()
) -> ServerlessProblem:
    """Read, validate and bind a serverless file; SpecError naming file and field."""
    p = Path(path)
    spec = parse(ServerlessFile, read_data(p), str(p))
    return build_problem(spec, str(p), catalogs)


def _link(given: LinkSpec | None, default: Link) -> Link:
    if given is None:
        return default
    return Link(latency_s=given.latency_us * 1e-6, bandwidth_bps=given.bandwidth_gbps * 1e9)


def options_of(spec: ServerlessFile, gpu: GpuType) -> tuple[Option, ...]:
    """Every (share, tp, clock) the file allows: shares at TP 1, whole GPUs above."""
    opts = spec.options
    if opts.clocks_mhz is not None:
        clocks = tuple(sorted(opts.clocks_mhz))
    else:
        clocks = spread_clocks_mhz(
            gpu, DEFAULT_CLOCK_COUNT, CLOCK_RANGE_FLOOR * gpu.max_sm_clock_mhz
        )
    out: list[Option] = []
    for tp in sorted(opts.tp):
        for share in sorted(opts.shares_pct) if tp == 1 else [100]:
            for clock in clocks:
                out.append(Option(share, tp, clock))
    return tuple(out)


def phase_workload(m_spec_index: int, spec: ServerlessFile, ttft_ms: float) -> Workload:
    """The serving workload the performance model evaluates for one model, with the
    prefill's TTFT budget ``ttft_ms``."""
    sm = spec.models[m_spec_index]
    return Workload(
        name=sm.name,
        model=sm.model,
        rate_rps=1.0,
        prompt_tokens=sm.prompt_tokens,
        output_tokens=sm.output_tokens,
        slo=Slo(ttft_ms=max(ttft_ms, 1e-6), tbt_ms=sm.slo.tbt_ms, percentile=sm.slo.percentile),
    )


def perf_options(spec: ServerlessFile) -> Options:
    """The performance model's options for every instance of the file: its batch limit
    and memory reserve fraction."""
    return Options(
        max_batch=spec.options.max_batch,
        memory_reserve_fraction=spec.options.memory_reserve_fraction,
    )


def instance_memory_gb(gpu: GpuType, spec: ServerlessFile, opt: Option) -> float:
    """Memory (GB) one instance of ``opt`` may use on each of its GPUs: its share of the
    GPU's memory less the file's reserve fraction."""
    return gpu.memory_gb * opt.share_pct / 100.0 * (1.0 - spec.options.memory_reserve_fraction)


def instance_op_spec(
    gpu: GpuType,
    llm: LlmModel,
    workload: Workload,
    phase: Phase,
    opt: Option,
    spec: ServerlessFile,
    options: Options,
) -> OpSpec:
    """The operating point of one instance of ``opt`` serving ``llm`` in ``phase``: the
    option's clock (MHz) and TP degree, its SM share as both the SM and the memory
    bandwidth fraction, :func:`instance_memory_gb` of memory; ``options`` from
    :func:`perf_options`."""
    return OpSpec(
        gpu=gpu,
        model=llm,
        workload=workload,
        phase=phase,
        clock_mhz=opt.clock_mhz,
        sm_fraction=opt.share_pct / 100.0,
        bw_fraction=opt.share_pct / 100.0,
        memory_gb=instance_memory_gb(gpu, spec, opt),
        tp=opt.tp,
        options=options,
    )


def build_problem(
    spec: ServerlessFile, source: str = "<serverless>", catalogs: tuple[str, ...] | list[str] = ()
) -> ServerlessProblem:
    """Bind a parsed file to the catalog and evaluate every option; SpecError for
    unknown catalog names, clocks the GPU does not support and models no option
    serves."""
    catalog, problems = bind_catalog(extra=list(catalogs))
    if problems:
        raise SpecError(problems)
    errors: list[str] = []
    if spec.gpu not in catalog.gpus:
        try:
            catalog.gpu(spec.gpu)
        except KeyError as exc:
            raise SpecError([f"{source}: gpu: {exc.args[0]}"]) from None
    gpu = catalog.gpus[spec.gpu]
    llms: list[LlmModel] = []
    for i, sm in enumerate(spec.models):
        try:
            llms.append(catalog.model(sm.model))
        except KeyError as exc:
            errors.append(f"{source}: models[{i}]({sm.name}).model: {exc.args[0]}")
            continue
        # a prompt past the model's context is the file's error, not the SLO's
        prompt, output = sm.prompt_tokens, sm.output_tokens
        longest = (prompt.max or prompt.mean) + (output.max or output.mean)
        if longest > llms[-1].max_context:
            errors.append(
                f"{source}: models[{i}]({sm.name}).prompt_tokens: prompt + output of up to "
                f"{longest:g} tokens exceed {sm.model}'s context of "
                f"{llms[-1].max_context} tokens"
            )
    supported = set(gpu.sm_clocks_mhz())
    for clock in spec.options.clocks_mhz or ():
        if not gpu.min_sm_clock_mhz <= clock <= gpu.max_sm_clock_mhz:
            errors.append(
                f"{source}: options.clocks_mhz: {clock} MHz is outside {gpu.name}'s "
                f"{gpu.min_sm_clock_mhz}..{gpu.max_sm_clock_mhz} MHz"
            )
        elif clock not in supported:
            near = ", ".join(str(c) for c in gpu.nearest_clocks_mhz(clock))
            errors.append(
                f"{source}: options.clocks_mhz: {clock} MHz is not a supported SM clock of "
                f"{gpu.name}; nearest supported: {near} MHz"
            )
    if errors:
        raise SpecError(errors)
    links = (_link(spec.links.nvlink, NVLINK_H100), _link(spec.links.network, NETWORK_H100))
    options = options_of(spec, gpu)
    n_m, n_o = len(llms), len(options)
    options_perf = perf_options(spec)
    kv_req = np.array(
        [kv_bytes(llm, sm.prompt_tokens.mean) for llm, sm in zip(llms, spec.models, strict=True)]
    )
    transfer = np.array([[lk.transfer_s(b) for lk in links] for b in kv_req])
    specs: list[OpSpec] = []
    for m, (llm, sm) in enumerate(zip(llms, spec.models, strict=True)):
        wl_link = [phase_workload(m, spec, sm.slo.ttft_ms - 1e3 * transfer[m, k]) for k in (0, 1)]
        for opt in options:
            phases: tuple[tuple[Phase, Workload], ...] = (
                ("prefill", wl_link[0]),
                ("prefill", wl_link[1]),
                ("decode", wl_link[0]),
            )
            for phase, wl in phases:
                specs.append(instance_op_spec(gpu, llm, wl, phase, opt, spec, options_perf))
    key = json.dumps(
        [
            gpu.model_dump(mode="json"),
            [llm.model_dump(mode="json") for llm in llms],
            spec.model_dump(mode="json", include={"options", "links"}),
            [m.model_dump(mode="json", exclude={"demand_rps", "name"}) for m in spec.models],
        ],
        sort_keys=True,
    )
    cached = _PERF_TABLES.get(key)
    if cached is None:
        params = build_params(specs)
        first, inverse = params.distinct()
        distinct = params.take(first)
        cached = (
            slo_capacity(distinct)[inverse].reshape(n_m, n_o, 3),
            energy_per_request_j(distinct)[inverse].reshape(n_m, n_o, 3),
        )
        _PERF_TABLES[key] = cached
        while len(_PERF_TABLES) > PERF_TABLES_KEPT:
            _PERF_TABLES.pop(next(iter(_PERF_TABLES)))
    cap, energy = cached[0].copy(), cached[1].copy()
    for m in range(n_m):
        for k in (0, 1):
            if 1e3 * transfer[m, k] >= spec.models[m].slo.ttft_ms:
                cap[m, :, k] = 0.0  # the transfer alone breaks the TTFT SLO
    cap = np.where(cap > 1e-9, cap * spec.options.load_fraction, 0.0)
    for m, sm in enumerate(spec.models):
        if not (cap[m, :, :2] > 0).any() or not (cap[m, :, 2] > 0).any():
            phase = "prefill" if not (cap[m, :, :2] > 0).any() else "decode"
            errors.append(
                f"{source}: models[{m}]({sm.name}).slo: no instance option serves its {phase} "
                "within the SLO (give larger shares, tp or a looser SLO)"
            )
    if errors:
        raise SpecError(errors)
    on_w = np.array([gpu_on_power_w(gpu, o.clock_mhz) * o.gpus for o in options])
    cs = spec.cold_start
    load = np.array(
        [
            [load_time_s(llm.weight_bytes, o.tp, cs.bandwidth_gbps, cs.fixed_s) for o in options]
            for llm in llms
        ]
    )
    obj = spec.objective
    weights = {
        "gpu_seconds": (1.0, 0.0),
        "energy": (0.0, 1.0),
        "weighted": (1.0, obj.energy_weight_per_j),
    }
    w_gpu, w_j = weights[obj.kind]
    return ServerlessProblem(
        spec=spec,
        source=source,
        gpu=gpu,
        llms=tuple(llms),
        options=options,
        links=links,
        demand=np.array([sm.demand_rps for sm in spec.models], dtype=np.float64),
        cap_prefill=np.ascontiguousarray(cap[:, :, :2]),
        cap_decode=np.ascontiguousarray(cap[:, :, 2]),
        energy_prefill=np.ascontiguousarray(energy[:, :, 0]),
        energy_decode=np.ascontiguousarray(energy[:, :, 2]),
        on_w=on_w,
        load_s=load,
        kv_request_bytes=kv_req,
        transfer_s=transfer,
        fits=np.array([[o.tp <= n.gpus for o in options] for n in spec.nodes]),
        node_gpus=np.array([float(n.gpus) for n in spec.nodes]),
        nic_bps=np.array([n.nic_gbps * 1e9 for n in spec.nodes]),
        power_cap_w=np.array([n.power_cap_w or np.inf for n in spec.nodes]),
        gpu_s_weight=w_gpu,
        energy_weight=w_j,
    )
