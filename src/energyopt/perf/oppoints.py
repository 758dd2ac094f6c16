"""The operating-point table of a problem: for every unit (workload or phase),
GPU type, clock, SM share (or MIG profile) and tensor-parallel size, its SLO
capacity, energy per request and memory. Every formulation reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog import mig
from energyopt.catalog.problem import Problem
from energyopt.perf.clocks import candidate_clocks_mhz
from energyopt.perf.energy import line_and_worst_case, service_latency_ms
from energyopt.perf.memo import capacity_and_design_batch
from energyopt.perf.params import FloatArray, OpParams, OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.hardware import GpuType
from energyopt.spec.workload import Phase, Workload

IntArray = NDArray[np.int64]
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Unit:
    """A placement unit: a workload, or one phase of a disaggregated workload."""

    index: int
    workload: str
    phase: Phase
    rate_rps: float

    @property
    def label(self) -> str:
        """Human-readable name, e.g. ``chat`` or ``chat:prefill``."""
        return self.workload if self.phase == "both" else f"{self.workload}:{self.phase}"


def candidate_clocks(problem: Problem, gpu: GpuType) -> tuple[int, ...]:
    """Candidate SM clocks of a GPU type (MHz, ascending): given, or evenly spread."""
    opts = problem.instance.options
    return candidate_clocks_mhz(gpu, opts.clocks_mhz, opts.clock_count)


def share_options(
    problem: Problem, gpu: GpuType
) -> list[tuple[int, str | None, float, float, float]]:
    """(share units, MIG profile, SM fraction, bandwidth fraction, memory GB) per option.

    MPS shares are in percent of the GPU (capacity 100). A MIG profile's share is
    ``catalog.mig.share_units`` (memory and compute slices in one number; capacity
    ``catalog.mig.share_capacity``), so a GPU's share constraint holds exactly when
    NVIDIA's placements can hold the layout. ``+me`` profiles (the smallest profile
    plus media engines, which serving does not use) are offered only when the
    instance lists them in ``sharing.mig_profiles``.
    """
    opts = problem.instance.options
    usable = 1.0 - opts.memory_reserve_fraction
    if opts.sharing.mode == "mig" and gpu.mig_profiles:
        allowed = opts.sharing.mig_profiles
        return [
            (
                mig.share_units(gpu, prof),
                prof.name,
                prof.sm_count / gpu.sm_count,
                prof.memory_gb / gpu.memory_gb,
                prof.memory_gb * usable,
            )
            for prof in gpu.mig_profiles
            if (prof.name in allowed if allowed is not None else not prof.media_extensions)
        ]
    return [
        (level, None, level / 100.0, level / 100.0, gpu.memory_gb * usable)
        for level in opts.sharing.levels()
    ]


def share_capacity(problem: Problem, gpu: GpuType) -> int:
    """Share units one GPU holds: 100 (percent), or ``catalog.mig.share_capacity`` in MIG."""
    if problem.instance.options.sharing.mode == "mig" and gpu.mig_profiles:
        return mig.share_capacity(gpu)
    return 100


def units_of(problem: Problem) -> list[Unit]:
    """Placement units in workload order."""
    units: list[Unit] = []
    for wl in problem.instance.workloads:
        for phase in wl.phases():
            units.append(Unit(len(units), wl.name, phase, wl.rate_rps))
    return units


def tp_sizes(problem: Problem, workload: Workload, gpu: GpuType, per_node: int) -> list[int]:
    """Tensor-parallel sizes to consider: the smallest whose weights fit, and one larger."""
    model = problem.model_of(workload)
    usable = gpu.memory_gb * 1e9 * (1.0 - problem.instance.options.memory_reserve_fraction)
    allowed = workload.tensor_parallel or TP_SIZES
    fitting = [k for k in sorted(allowed) if k <= per_node and model.weight_bytes / k < usable]
    if workload.tensor_parallel:
        return fitting
    return fitting[:2]


def max_gpus_per_node(problem: Problem, type_name: str) -> int:
    """Largest number of GPUs of one type in a single node."""
    best = 0
    for node in problem.instance.cluster.nodes:
        best = max(best, sum(e.count for e in node.gpus if e.type == type_name))
    return best


def op_spec(
    problem: Problem,
    workload: Workload,
    phase: Phase,
    gpu: GpuType,
    clock_mhz: float,
    share: tuple[int, str | None, float, float, float],
    tp: int,
) -> OpSpec:
    """The performance-model input of one operating point."""
    _, _, sm_frac, bw_frac, memory_gb = share
    return OpSpec(
        gpu=gpu,
        model=problem.model_of(workload),
        workload=workload,
        phase=phase,
        clock_mhz=clock_mhz,
        sm_fraction=sm_frac,
        bw_fraction=bw_frac,
        memory_gb=memory_gb,
        tp=tp,
        options=problem.instance.options,
        profile=problem.profiles.get((gpu.name, workload.model)),
    )


@dataclass(frozen=True)
class OpTable:
    """Every operating point with a positive SLO capacity (arrays indexed by op)."""

    units: list[Unit]
    type_names: list[str]
    clocks: dict[str, tuple[int, ...]]
    share_capacity: dict[str, int]
    unit: IntArray
    gpu_type: IntArray  # index into type_names
    clock_mhz: IntArray
    share: IntArray  # share units (percent or MIG slices)
    mig_profile: list[str | None]
    tp: IntArray
    capacity_rps: FloatArray
    marginal_j: FloatArray  # J per request (W per req/s) of its power line, whole TP group
    fixed_w: FloatArray  # W of its power line while placed, whole TP group
    memory_gb: FloatArray  # per GPU at capacity
    latency_ms: FloatArray  # unloaded service latency at the design batch
    ref_latency_ms: FloatArray  # same at max clock and the full GPU
    peak_power_w: FloatArray  # worst-case dynamic W at its SLO capacity, whole TP group
    on_power: dict[tuple[str, int], float]  # W of an on GPU at a clock, nothing running

    def __len__(self) -> int:
        return int(self.unit.shape[0])

    def power_w(self, op: int, rate_rps: float) -> float:
        """Dynamic power of op ``op`` placed at ``rate_rps`` (W, whole TP group): its
        power line, 0 at no rate (perf/energy.py ``power_line``)."""
        if rate_rps <= 0:
            return 0.0
        return float(self.fixed_w[op]) + float(self.marginal_j[op]) * rate_rps

    def top_rps(self, op: int) -> float:
        """The most op ``op`` can carry: its SLO capacity, or its unit's rate if less."""
        rate = self.units[int(self.unit[op])].rate_rps
        cap = float(self.capacity_rps[op])
        return min(cap, rate) if rate > 0 else cap

    def ops_of(self, unit: int) -> IntArray:
        """Indices of the ops of one unit, ascending (from one sort of the table by
        unit, made on first use: a scan of the table per unit made residual
        packing quadratic, about 0.5 ms a unit at 102,400 GPUs and 10,000 units,
        twenty times over)."""
        order, bounds = self._by_unit
        if not 0 <= unit < len(bounds) - 1:
            return np.flatnonzero(self.unit == unit)
        return order[bounds[unit] : bounds[unit + 1]].copy()

    @cached_property
    def _by_unit(self) -> tuple[IntArray, IntArray]:
        """(ops sorted by unit, stable; where each unit's ops start, one entry per
        unit plus the end)."""
        order = np.argsort(self.unit, kind="stable").astype(np.int64)
        bounds = np.searchsorted(self.unit[order], np.arange(len(self.units) + 1))
        return order, bounds.astype(np.int64)


def _power_figures(
    params: OpParams, inverse: IntArray, capacity: FloatArray, top: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Power line (fixed W, marginal J per request) at each op's top rate and its
    worst-case draw at capacity (W), from one model run over the distinct
    (point, top, capacity) triples; ops of distinct points are given by ``inverse``."""
    keys = np.stack([inverse.astype(np.float64), top, capacity], axis=1)
    uniq, back = np.unique(keys, axis=0, return_inverse=True)
    back = back.reshape(-1)
    rows = params.take(uniq[:, 0].astype(np.int64))
    tops = np.where(uniq[:, 1] > 1e-9, uniq[:, 1], 0.0)
    caps = np.where(uniq[:, 2] > 1e-9, uniq[:, 2], 0.0)
    line, peak = line_and_worst_case(rows, tops, caps)
    return (
        np.asarray(line.fixed_w[back]),
        np.asarray(line.marginal_j[back]),
        np.asarray(peak[back]),
    )


def build_op_table(problem: Problem) -> OpTable:
    """Evaluate the performance model on every candidate operating point."""
    units = units_of(problem)
    type_names = problem.gpu_types_used()
    specs: list[OpSpec] = []
    refs: list[OpSpec] = []
    meta: list[tuple[int, int, int, int, str | None, int]] = []
    clocks: dict[str, tuple[int, ...]] = {}
    caps: dict[str, int] = {}
    on_power: dict[tuple[str, int], float] = {}
    for t, type_name in enumerate(type_names):
        gpu = problem.gpu_type(type_name)
        clocks[type_name] = candidate_clocks(problem, gpu)
        caps[type_name] = share_capacity(problem, gpu)
        shares = share_options(problem, gpu)
        full = (
            caps[type_name],
            None,
            1.0,
            1.0,
            gpu.memory_gb * (1 - problem.instance.options.memory_reserve_fraction),
        )
        per_node = max_gpus_per_node(problem, type_name)
        for unit in units:
            wl = problem.instance.workload(unit.workload)
            for tp in tp_sizes(problem, wl, gpu, per_node):
                options = shares if tp == 1 else [full]
                for share in options:
                    ref = op_spec(problem, wl, unit.phase, gpu, gpu.max_sm_clock_mhz, full, tp)
                    for clock in clocks[type_name]:
                        specs.append(op_spec(problem, wl, unit.phase, gpu, clock, share, tp))
                        refs.append(ref)
                        meta.append((unit.index, t, clock, share[0], share[1], tp))
        for clock in clocks[type_name]:
            on_power[(type_name, clock)] = gpu_on_power_w(gpu, clock)
    if not specs:
        return _empty(units, type_names, clocks, caps, on_power)
    all_params = build_params(specs)
    first, inverse = all_params.distinct()
    params = all_params.take(first)
    all_refs = build_params(refs)
    ref_first, ref_inverse = all_refs.distinct()
    ref_params = all_refs.take(ref_first)
    figures = capacity_and_design_batch(params, ref_params)
    capacity, batch = figures.capacity_rps, figures.design_batch
    latency = service_latency_ms(params, batch)
    capacity, latency = capacity[inverse], latency[inverse]
    memory_bytes = figures.memory_bytes[inverse]
    unit_rate = np.asarray([units[m[0]].rate_rps for m in meta], dtype=np.float64)
    top = np.where(unit_rate > 0, np.minimum(capacity, unit_rate), capacity)
    fixed, marginal, peak = _power_figures(params, inverse, capacity, top)
    ref_latency = service_latency_ms(ref_params, figures.ref_design_batch)[ref_inverse]
    keep = np.flatnonzero(capacity > 1e-9)
    return OpTable(
        units=units,
        type_names=type_names,
        clocks=clocks,
        share_capacity=caps,
        unit=np.asarray([meta[i][0] for i in keep], dtype=np.int64),
        gpu_type=np.asarray([meta[i][1] for i in keep], dtype=np.int64),
        clock_mhz=np.asarray([meta[i][2] for i in keep], dtype=np.int64),
        share=np.asarray([meta[i][3] for i in keep], dtype=np.int64),
        mig_profile=[meta[i][4] for i in keep],
        tp=np.asarray([meta[i][5] for i in keep], dtype=np.int64),
        capacity_rps=capacity[keep],
        marginal_j=marginal[keep],
        fixed_w=fixed[keep],
        memory_gb=memory_bytes[keep] / 1e9,
        latency_ms=latency[keep],
        ref_latency_ms=ref_latency[keep],
        peak_power_w=peak[keep],
        on_power=on_power,
    )


def _empty(
    units: list[Unit],
    type_names: list[str],
    clocks: dict[str, tuple[int, ...]],
    caps: dict[str, int],
    on_power: dict[tuple[str, int], float],
) -> OpTable:
    ints = np.zeros(0, dtype=np.int64)
    floats = np.zeros(0, dtype=np.float64)
    return OpTable(
        units,
        type_names,
        clocks,
        caps,
        ints,
        ints,
        ints,
        ints,
        [],
        ints,
        floats,
        floats,
        floats,
        floats,
        floats,
        floats,
        floats,
        on_power,
    )
