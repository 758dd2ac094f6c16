"""Roofline latency and power of one forward pass (a prefill or a decode step).

Compute-bound work scales with the SM clock and the SM share; memory-bound work
with the memory bandwidth the slice gets. See docs/performance-model.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.power import clock_power_factor


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


def _finish(p: OpParams, flops: FloatArray, total_bytes: FloatArray, tokens: FloatArray) -> Pass:
    """Turn a pass's FLOPs and bytes (whole group) into time and power per GPU."""
    flops_rate = p.peak_flops * p.clock_ratio * p.sm_fraction * p.eff_compute
    bw = p.peak_bw * p.bw_fraction * p.eff_memory
    compute_ms = flops / (flops_rate * p.tp) * 1e3
    memory_ms = total_bytes / (bw * p.tp) * 1e3
    overhead_ms = p.overhead_ms * (0.5 + 0.5 / p.clock_ratio)
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
    mem_util = np.minimum(bytes_per_gpu / (ms / 1e3) / p.peak_bw, 1.0)
    dyn = p.tdp_w - p.idle_w
    power = dyn * (
        p.sm_power_fraction * _clock_factor(p) * p.sm_fraction * sm_activity
        + (1.0 - p.sm_power_fraction) * mem_util
    )
    return Pass(ms, compute_ms, memory_ms, bytes_per_gpu, np.asarray(power))


def _prefill(p: OpParams, tokens: FloatArray, seqs: FloatArray | float) -> Pass:
    total = tokens * seqs
    flops = 2.0 * p.active_params * total + 2.0 * p.layers * tokens**2 * p.attn_dim * seqs
    total_bytes = weights_touched(p, total) + total * p.kv_bytes_per_token
    return _finish(p, flops, total_bytes, total)


def _decode(p: OpParams, batch: FloatArray, context: FloatArray) -> Pass:
    flops = 2.0 * p.active_params * batch + 4.0 * p.layers * batch * context * p.attn_dim
    total_bytes = weights_touched(p, batch) + batch * context * p.kv_bytes_per_token
    return _finish(p, flops, total_bytes, batch)


def prefill_pass(p: OpParams, tokens: FloatArray, seqs: FloatArray | float = 1.0) -> Pass:
    """Prefill of ``seqs`` prompts of ``tokens`` tokens each, batched (causal attention)."""
    out = _prefill(p, tokens, seqs)
    return _measured(p, out, lambda q: _prefill(q, tokens, seqs), "prefill", tokens, seqs)


def decode_pass(p: OpParams, batch: FloatArray, context: FloatArray) -> Pass:
    """One decode step for ``batch`` sequences of mean ``context`` tokens."""
    out = _decode(p, batch, context)
    return _measured(p, out, lambda q: _decode(q, batch, context), "decode", batch, context)


def _measured(
    p: OpParams,
    out: Pass,
    analytic: Callable[[OpParams], Pass],
    kind: str,
    a: FloatArray | float,
    b: FloatArray | float,
) -> Pass:
    """Scale the analytic pass by measured / analytic at the profile's reference point.

    The reference is the profile's clock on whole GPUs; the analytic model then
    carries only the clock and share dependence (see catalog/profiles.py).
    """
    has = p.has_profile
    if not has.any():
        return out
    ref = analytic(
        p.replace(
            clock_ratio=p.profile_clock_ratio,
            sm_fraction=np.ones_like(p.sm_fraction),
            bw_fraction=np.ones_like(p.bw_fraction),
        )
    )
    aa = np.broadcast_to(np.asarray(a, dtype=np.float64), p.clock_ratio.shape)
    bb = np.broadcast_to(np.asarray(b, dtype=np.float64), p.clock_ratio.shape)
    factor = np.ones_like(out.ms)
    for i in np.flatnonzero(has):
        prof = p.profile[i]
        tp = int(p.tp[i])
        if kind == "prefill":
            measured = prof.prefill_ms(float(aa[i]), tp)
            if measured is not None:
                measured *= float(bb[i])  # seqs prompts measured one at a time
        else:
            measured = prof.decode_ms(float(aa[i]), float(bb[i]), tp)
        if measured is not None:
            factor[i] = measured / float(ref.ms[i])
    return Pass(
        out.ms * factor,
        out.compute_ms * factor,
        out.memory_ms * factor,
        out.bytes_per_gpu,
        out.power_w,  # activity is the analytic estimate; energy follows the measured time
    )


def kernel_pass(p: OpParams, flops: FloatArray, total_bytes: FloatArray) -> Pass:
    """A generic kernel of ``flops`` FLOPs moving ``total_bytes`` bytes on one GPU.

    The same roofline and power model as a forward pass, without collectives:
    ``p.tp`` should be 1 and the model fields of ``p`` are unused.
    """
    return _finish(p, flops, total_bytes, np.zeros_like(flops))
