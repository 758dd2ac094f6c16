"""Flat numpy parameters of many operating points, so the model runs vectorized.

Every array has one entry per operating point. Units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.profiles import MeasuredProfile
from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Options
from energyopt.spec.llm import LlmModel
from energyopt.spec.workload import Phase, Workload

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

PHASE_CODE: dict[Phase, int] = {"both": 0, "prefill": 1, "decode": 2}
PCIE_GBPS = 32.0
"""Bandwidth used between GPUs that have no NVLink (PCIe 4.0 x16), GB/s."""


@dataclass(frozen=True)
class OpSpec:
    """One operating point in object form: who runs where, at which clock and share."""

    gpu: GpuType
    model: LlmModel
    workload: Workload
    phase: Phase
    clock_mhz: float
    sm_fraction: float
    bw_fraction: float
    memory_gb: float
    tp: int = 1
    options: Options = field(default_factory=Options)
    profile: MeasuredProfile | None = None


@dataclass(frozen=True)
class OpParams:
    """Vectorized parameters of N operating points."""

    # hardware and slice
    peak_flops: FloatArray  # FLOP/s of the whole GPU at its max clock
    peak_bw: FloatArray  # B/s of the whole GPU
    eff_compute: FloatArray
    eff_memory: FloatArray
    overhead_ms: FloatArray
    clock_ratio: FloatArray  # f / f_max
    sm_fraction: FloatArray
    bw_fraction: FloatArray
    memory_bytes: FloatArray  # usable memory of the slice per GPU, bytes
    tp: FloatArray
    link_bw: FloatArray  # achieved B/s between GPUs of a TP group
    allreduce_ms: FloatArray  # fixed cost of one all-reduce
    tdp_w: FloatArray
    idle_w: FloatArray
    sm_power_fraction: FloatArray
    mem_bound_activity: FloatArray
    voltage_floor: FloatArray
    knee_fraction: FloatArray
    locked_clock_w: FloatArray
    compute_clock_fixed: FloatArray  # share of compute time that does not follow the clock
    overhead_clock_fixed: FloatArray  # share of the per-pass overhead that is host time
    latency_margin: FloatArray  # plan as if passes took (1 + margin) times as long
    # model
    layers: FloatArray
    hidden: FloatArray
    attn_dim: FloatArray  # heads * head_dim
    active_params: FloatArray
    weight_bytes: FloatArray
    bytes_per_param: FloatArray
    shared_params: FloatArray  # params every token uses (MoE: non-expert)
    expert_params: FloatArray  # params of one expert (all layers); 0 for dense
    experts: FloatArray
    experts_per_token: FloatArray
    kv_bytes_per_token: FloatArray
    # workload
    prompt_tokens: FloatArray
    prompt_cv: FloatArray  # coefficient of variation of the prompt tokens (0: all the mean)
    output_tokens: FloatArray
    chunk_tokens: FloatArray
    quantile: FloatArray
    ttft_slo_ms: FloatArray
    tbt_slo_ms: FloatArray
    phase: NDArray[np.int64]
    max_batch: FloatArray
    # measured profile of the (GPU, model) pair, or None (object array)
    profile: NDArray[np.object_]
    has_profile: NDArray[np.bool_]  # profile is not None (kept apart: checked every pass)
    profile_clock_ratio: FloatArray  # clock the profile was measured at / f_max
    max_clock_mhz: FloatArray  # f_max of the GPU type (MHz), to place f on a profile's clocks

    def __len__(self) -> int:
        return int(self.clock_ratio.shape[0])

    def replace(self, **changes: FloatArray) -> OpParams:
        """A copy with some arrays replaced."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return OpParams(**values)

    def distinct(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(first, inverse): one representative index per distinct operating point, and
        for every point the position of its representative in ``first``.

        Fleets with many workloads of one kind repeat the same parameter rows; the
        model needs to be evaluated once per distinct row (``take(first)``, then
        index the results with ``inverse``).
        """
        columns = [
            np.asarray(getattr(self, f.name), dtype=np.float64)
            for f in fields(self)
            if f.name != "profile"
        ]
        ids: dict[int, int] = {}
        for prof in self.profile:
            ids.setdefault(id(prof), len(ids))
        columns.append(np.asarray([ids[id(prof)] for prof in self.profile], dtype=np.float64))
        rows = np.ascontiguousarray(np.stack(columns, axis=1))
        # Rows compared as raw bytes, over the columns that vary only: np.unique
        # with axis=0 compares field by field and took 4.5 s for 250,000 rows of 48
        # parameters, the bytes 0.1 s. (Bitwise equal rows are equal; the first
        # occurrence of each stays its representative, as before. A 0.0 and a
        # -0.0 are then two points, evaluated apart.)
        if rows.shape[0] == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        varying = np.flatnonzero((rows != rows[:1]).any(axis=0))
        if varying.size == 0:
            return np.zeros(1, dtype=np.int64), np.zeros(rows.shape[0], dtype=np.int64)
        keys = np.ascontiguousarray(rows[:, varying])
        raw = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).reshape(-1)
        _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
        return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)

    def row_keys(self) -> list[bytes]:
        """One key per operating point, equal for two points exactly when every
        parameter is bitwise equal and both have the same profile object (its
        ``id``: a holder of keys keeps the profiles alive, see ``perf.memo``)."""
        columns = [
            np.asarray(getattr(self, f.name), dtype=np.float64)
            for f in fields(self)
            if f.name != "profile"
        ]
        columns.append(np.asarray([id(prof) for prof in self.profile], dtype=np.float64))
        rows = np.ascontiguousarray(np.stack(columns, axis=1))
        return [row.tobytes() for row in rows]

    def take(self, index: NDArray[np.int64]) -> OpParams:
        """The operating points at ``index``."""
        return OpParams(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(parts: list[OpParams]) -> OpParams:
        """The operating points of ``parts``, one after another (one vectorized model
        run over all of them costs about as much as a run over the largest part)."""
        return OpParams(
            **{
                f.name: np.concatenate([getattr(q, f.name) for q in parts])
                for f in fields(OpParams)
            }
        )


def _moe_split(model: LlmModel) -> tuple[float, float]:
    """(shared params, params of one expert) in units of parameters."""
    total = model.params_total_b * 1e9
    active = model.params_active_b * 1e9
    if model.experts <= 1 or model.experts == model.experts_per_token:
        return active, 0.0
    expert = (total - active) / (model.experts - model.experts_per_token)
    shared = active - model.experts_per_token * expert
    return max(shared, 0.0), expert


PER_SPEC = ("clock_ratio", "sm_fraction", "bw_fraction", "memory_bytes", "tp")
"""The fields of ``OpParams`` that vary between the specs of one (GPU type, model,
workload, phase, options, profile); ``build_params`` computes every other field
once per such combination."""


def _shared_row(s: OpSpec) -> dict[str, float]:
    """The fields of one spec's row that depend only on its GPU type, model,
    workload, phase, options and profile (every field but PER_SPEC and the profile)."""
    g, m, w = s.gpu, s.model, s.workload
    shared, expert = _moe_split(m)
    return {
        "peak_flops": g.peak_bf16_tflops * 1e12,
        "peak_bw": g.memory_bandwidth_gbps * 1e9,
        "eff_compute": g.efficiency.compute,
        "eff_memory": g.efficiency.memory,
        "overhead_ms": g.efficiency.step_overhead_ms,
        # the fitted link efficiency is an NVLink figure; PCIe is taken at face value
        "link_bw": (g.nvlink_gbps * g.efficiency.link if g.nvlink_gbps else PCIE_GBPS) * 1e9,
        "allreduce_ms": g.efficiency.allreduce_latency_ms,
        "tdp_w": g.tdp_w,
        "idle_w": g.idle_w,
        "sm_power_fraction": g.power.sm_fraction,
        "mem_bound_activity": g.power.memory_bound_sm_activity,
        "voltage_floor": g.power.voltage_floor,
        "knee_fraction": g.power.knee_fraction,
        "locked_clock_w": g.power.locked_clock_w,
        "compute_clock_fixed": g.efficiency.compute_clock_fixed,
        "overhead_clock_fixed": g.efficiency.overhead_clock_fixed,
        "latency_margin": (
            g.efficiency.latency_error
            if s.options.latency_margin == "calibrated"
            else s.options.latency_margin
        ),
        "layers": m.layers,
        "hidden": m.hidden_size,
        "attn_dim": m.heads * m.head_dim_eff,
        "active_params": m.params_active_b * 1e9,
        "weight_bytes": m.weight_bytes,
        "bytes_per_param": m.bytes_per_param,
        "shared_params": shared,
        "expert_params": expert,
        "experts": m.experts,
        "experts_per_token": m.experts_per_token,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "prompt_tokens": w.prompt_tokens.mean,
        "prompt_cv": w.prompt_tokens.cv,
        "output_tokens": w.output_tokens.mean,
        "chunk_tokens": s.options.chunk_tokens,
        "quantile": w.slo.quantile,
        "ttft_slo_ms": w.slo.ttft_ms,
        "tbt_slo_ms": w.slo.tbt_ms,
        "phase": PHASE_CODE[s.phase],
        "max_batch": s.options.max_batch,
        "profile_clock_ratio": (
            s.profile.clock_mhz / g.max_sm_clock_mhz if s.profile is not None else 1.0
        ),
        "max_clock_mhz": g.max_sm_clock_mhz,
    }


def build_params(specs: list[OpSpec]) -> OpParams:
    """Stack ``specs`` into arrays.

    The fields shared by the specs of one (GPU type, model, workload, phase,
    options, profile) are computed once per such combination and spread by
    index; a row per spec cost about 30 s at 102,400 GPUs (a million specs)."""
    groups: dict[tuple[int, int, int, str, int, int], int] = {}
    first: list[OpSpec] = []
    group = np.empty(len(specs), dtype=np.int64)
    clock = np.empty(len(specs), dtype=np.float64)
    sm_fraction = np.empty(len(specs), dtype=np.float64)
    bw_fraction = np.empty(len(specs), dtype=np.float64)
    memory_gb = np.empty(len(specs), dtype=np.float64)
    tp = np.empty(len(specs), dtype=np.float64)
    for i, s in enumerate(specs):
        key = (id(s.gpu), id(s.model), id(s.workload), s.phase, id(s.options), id(s.profile))
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(first)
            first.append(s)
        group[i] = g
        clock[i] = s.clock_mhz
        sm_fraction[i] = s.sm_fraction
        bw_fraction[i] = s.bw_fraction
        memory_gb[i] = s.memory_gb
        tp[i] = s.tp
    rows = [_shared_row(s) for s in first]
    names = [f.name for f in fields(OpParams) if f.name not in PER_SPEC]
    names = [n for n in names if n not in ("profile", "has_profile")]
    arrays: dict[str, NDArray[Any]] = {
        n: np.asarray([r[n] for r in rows], dtype=np.float64)[group] for n in names
    }
    arrays["phase"] = np.asarray([r["phase"] for r in rows], dtype=np.int64)[group]
    arrays["clock_ratio"] = clock / arrays["max_clock_mhz"]
    arrays["sm_fraction"] = sm_fraction
    arrays["bw_fraction"] = bw_fraction
    arrays["memory_bytes"] = memory_gb * 1e9
    arrays["tp"] = tp
    profiles = np.empty(len(first), dtype=object)
    for k, s in enumerate(first):
        profiles[k] = s.profile
    arrays["profile"] = profiles[group]
    arrays["has_profile"] = np.asarray([s.profile is not None for s in first], dtype=bool)[group]
    return OpParams(**arrays)
