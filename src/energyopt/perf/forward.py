"""Roofline latency and power of one forward pass (a prefill or a decode step).

Compute-bound work scales with the SM clock and the SM share, except a fitted
fraction that does not follow the clock; memory-bound work scales with the memory
bandwidth the slice gets; the per-pass overhead is split into a host part and a
part that follows the clock. See docs/performance-model.md (§2-3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from energyopt.catalog.profiles import Measured
from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.power import (
    clock_power_factor,
    dynamic_range_w,
    memory_power_w,
    static_power_factor,
)
from energyopt.spec.hardware import Efficiency


@dataclass(frozen=True)
class ClockResponse:
    """How much of a pass's time follows the SM clock (fractions, 0..1).

    ``compute_fixed``: part of the compute-bound time at the max clock that does not
    shrink or grow with the clock (memory-bound kernels between the GEMMs, and the
    clock a loaded GPU really holds when locked near its maximum). Fitted on the
    Perseus A100 sweep (time ratios t(f)/t(1410 MHz) of GPT-3 175B and BLOOM 176B
    passes, ``../shared/data/dvfs/perseus-a100``) by ``perf.fitting.fit_clock``.

    ``overhead_fixed``: part of the per-pass overhead ``step_overhead_ms`` that is
    host time (launch, scheduling, sampling) and so independent of the clock; the
    rest is GPU time at the SM clock. Fitted on the H100 NVL LLaMA-7B sweep
    (``../shared/data/dvfs/h100nvl-llama7b``), where the GPU time of a
    launch-bound decode step overtakes the host time below about 720 MHz.
    """

    compute_fixed: float
    overhead_fixed: float


CLOCK_RESPONSE = ClockResponse(
    compute_fixed=Efficiency().compute_clock_fixed,
    overhead_fixed=Efficiency().overhead_clock_fixed,
)
"""Shipped clock response, the catalog's default (values and fits:
docs/performance-model.md, §7). A GPU type's ``efficiency.compute_clock_fixed`` and
``overhead_clock_fixed`` override it for that type (``energyopt calibrate`` fits them)."""


@dataclass(frozen=True)
class Pass:
    """Time split and power of one forward pass, per op (arrays)."""

    ms: FloatArray  # wall time of the pass
    compute_ms: FloatArray  # tensor-core time at the slice's FLOP/s
    memory_ms: FloatArray  # time to move the bytes at the slice's bandwidth
    bytes_per_gpu: FloatArray  # bytes read or written per GPU
    power_w: FloatArray  # dynamic power per GPU of the group while it runs (W)

    @property
    def energy_j(self) -> FloatArray:
        """Dynamic energy of the pass on one GPU of the group (J); multiply by TP size."""
        return self.power_w * self.ms / 1e3


def _clock_factor(p: OpParams) -> FloatArray:
    return clock_power_factor(p.clock_ratio, p.voltage_floor, p.knee_fraction)


def weights_touched(p: OpParams, tokens: FloatArray) -> FloatArray:
    """Bytes of weights a pass over ``tokens`` tokens reads (MoE: experts hit)."""
    dense = p.expert_params <= 0
    if dense.all():
        return p.weight_bytes
    frac_unused = np.power(
        np.clip(1.0 - p.experts_per_token / p.experts, 0.0, 1.0), np.maximum(tokens, 1.0)
    )
    experts_hit = p.experts * (1.0 - frac_unused)
    moe = (p.shared_params + experts_hit * p.expert_params) * p.bytes_per_param
    return np.where(dense, p.weight_bytes, np.minimum(moe, p.weight_bytes))


def clock_stretch(fixed: float | FloatArray, clock_ratio: FloatArray) -> FloatArray:
    """Time at ``clock_ratio`` relative to the max clock of work whose ``fixed`` part does
    not follow the clock: ``fixed + (1 - fixed) / r``."""
    return np.asarray(fixed + (1.0 - fixed) / clock_ratio)


def _finish(
    p: OpParams,
    flops: FloatArray,
    total_bytes: FloatArray,
    tokens: FloatArray,
    clock: ClockResponse | None = None,
) -> Pass:
    """Turn a pass's FLOPs and bytes (whole group) into time and power per GPU.

    ``clock`` replaces the GPU types' clock response (the calibration fits it); by
    default each op takes its type's ``compute_clock_fixed`` and ``overhead_clock_fixed``.
    """
    compute_fixed = p.compute_clock_fixed if clock is None else clock.compute_fixed
    overhead_fixed = p.overhead_clock_fixed if clock is None else clock.overhead_fixed
    flops_rate = p.peak_flops * p.sm_fraction * p.eff_compute
    bw = p.peak_bw * p.bw_fraction * p.eff_memory
    compute_ms = flops / (flops_rate * p.tp) * 1e3 * clock_stretch(compute_fixed, p.clock_ratio)
    memory_ms = total_bytes / (bw * p.tp) * 1e3
    overhead_ms = p.overhead_ms * clock_stretch(overhead_fixed, p.clock_ratio)
    # Two all-reduces per layer of the activations (ring: 2(k-1)/k of the message).
    msg = tokens * p.hidden * 2.0
    ring = 2.0 * (p.tp - 1.0) / p.tp * msg / p.link_bw * 1e3
    comm_ms = np.where(p.tp > 1, 2.0 * p.layers * (p.allreduce_ms + ring), 0.0)
    busy_ms = np.maximum(compute_ms, memory_ms) + overhead_ms
    ms = busy_ms + comm_ms
    # Collectives keep SMs and links busy about as much as memory-bound kernels.
    sm_active_ms = np.maximum(compute_ms, p.mem_bound_activity * busy_ms)
    sm_active_ms = sm_active_ms + p.mem_bound_activity * comm_ms
    sm_activity = sm_active_ms / ms
    bytes_per_gpu = total_bytes / p.tp
    dyn = dynamic_range_w(p.tdp_w, p.idle_w, p.locked_clock_w)
    sm_w = dyn * p.sm_power_fraction * _clock_factor(p) * p.sm_fraction * sm_activity
    power = np.minimum(sm_w + memory_power_w(bytes_per_gpu, ms), dyn)
    return Pass(ms, compute_ms, memory_ms, bytes_per_gpu, np.asarray(power))


def _prefill(
    p: OpParams, tokens: FloatArray, seqs: FloatArray | float, clock: ClockResponse | None
) -> Pass:
    total = tokens * seqs
    flops = 2.0 * p.active_params * total + 2.0 * p.layers * tokens**2 * p.attn_dim * seqs
    total_bytes = weights_touched(p, total) + total * p.kv_bytes_per_token
    return _finish(p, flops, total_bytes, total, clock)


def _decode(
    p: OpParams, batch: FloatArray, context: FloatArray, clock: ClockResponse | None
) -> Pass:
    flops = 2.0 * p.active_params * batch + 4.0 * p.layers * batch * context * p.attn_dim
    total_bytes = weights_touched(p, batch) + batch * context * p.kv_bytes_per_token
    return _finish(p, flops, total_bytes, batch, clock)


def prefill_pass(
    p: OpParams,
    tokens: FloatArray,
    seqs: FloatArray | float = 1.0,
    clock: ClockResponse | None = None,
) -> Pass:
    """Prefill of ``seqs`` prompts of ``tokens`` tokens each, batched (causal attention)."""
    out = _prefill(p, tokens, seqs, clock)
    return _measured(p, out, lambda q: _prefill(q, tokens, seqs, clock), "prefill", tokens, seqs)


def decode_pass(
    p: OpParams, batch: FloatArray, context: FloatArray, clock: ClockResponse | None = None
) -> Pass:
    """One decode step for ``batch`` sequences of mean ``context`` tokens."""
    out = _decode(p, batch, context, clock)
    return _measured(p, out, lambda q: _decode(q, batch, context, clock), "decode", batch, context)


def _measured(
    p: OpParams,
    out: Pass,
    analytic: Callable[[OpParams], Pass],
    kind: str,
    a: FloatArray | float,
    b: FloatArray | float,
) -> Pass:
    """Scale the analytic pass by measured / analytic at the profile's reference point.

    The reference is the measured point at the op's clock (interpolated between the
    profile's clocks), or at the nearest measured clock outside them, on whole GPUs;
    the analytic model carries only what the profile does not measure: the share,
    and the clock beyond the measured ones (see catalog/profiles.py). Where the
    profile measures power, the pass's dynamic power is the measured board power
    less the on-power at the reference clock, scaled the same way.
    """
    has = p.has_profile
    if not has.any():
        return out
    aa = np.broadcast_to(np.asarray(a, dtype=np.float64), p.clock_ratio.shape)
    bb = np.broadcast_to(np.asarray(b, dtype=np.float64), p.clock_ratio.shape)
    found: dict[int, Measured] = {}
    ref_ratio = np.array(p.clock_ratio, dtype=np.float64)
    for i in np.flatnonzero(has):
        prof = p.profile[i]
        tp = int(p.tp[i])
        clock_mhz = float(p.clock_ratio[i] * p.max_clock_mhz[i])
        if kind == "prefill":
            m = prof.prefill_at(float(aa[i]), tp, clock_mhz)
            if m is not None:  # seqs prompts measured one at a time
                m = Measured(m.ms * float(bb[i]), m.power_w, m.clock_mhz)
        else:
            m = prof.decode_at(float(aa[i]), float(bb[i]), tp, clock_mhz)
        if m is not None:
            found[int(i)] = m
            ref_ratio[i] = m.clock_mhz / p.max_clock_mhz[i]
    if not found:
        return out
    ref = analytic(
        p.replace(
            clock_ratio=ref_ratio,
            sm_fraction=np.ones_like(p.sm_fraction),
            bw_fraction=np.ones_like(p.bw_fraction),
        )
    )
    factor = np.ones_like(out.ms)
    power = np.array(out.power_w, dtype=np.float64)
    on_w = p.idle_w + p.locked_clock_w * static_power_factor(
        ref_ratio, p.voltage_floor, p.knee_fraction
    )
    for j, m in found.items():
        factor[j] = m.ms / float(ref.ms[j])
        if m.power_w is not None and ref.power_w[j] > 0:
            power[j] *= max(m.power_w - float(on_w[j]), 0.0) / float(ref.power_w[j])
    return Pass(
        out.ms * factor,
        out.compute_ms * factor,
        out.memory_ms * factor,
        out.bytes_per_gpu,
        np.asarray(power),
    )


def kernel_pass(
    p: OpParams,
    flops: FloatArray,
    total_bytes: FloatArray,
    clock: ClockResponse | None = None,
) -> Pass:
    """A generic kernel of ``flops`` FLOPs moving ``total_bytes`` bytes on one GPU.

    The same roofline and power model as a forward pass, without collectives:
    ``p.tp`` should be 1 and the model fields of ``p`` are unused.
    """
    return _finish(p, flops, total_bytes, np.zeros_like(flops), clock)
