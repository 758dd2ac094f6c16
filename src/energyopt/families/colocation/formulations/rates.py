"""Speed, power, memory and contention features of a job at one configuration.

A configuration of a job is (GPU type, GPU count n, SM clock, MPS SM share).
Everything here comes from the roofline passes of ``perf.forward``:

- training: an iteration on each of the n data-parallel GPUs is one forward pass
  over its ``tokens_per_iteration / n`` tokens and a backward pass of twice its
  cost (3 forward passes), followed by the job's idle phases (data loading,
  communication scaled by the ring factor 2(n-1)/n, pipeline bubbles);
- offline inference: each of the n GPUs runs a replica that prefills ``batch``
  prompts together and then decodes them for ``output_tokens`` steps.

MPS limits the SMs a job gets (``sm_fraction = share``) but not the memory
bandwidth, so each job is evaluated with the whole bandwidth; contention for it
is the interference model's business (``interference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.spec import InferenceJob, TrainingJob
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import FloatArray, OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.workload import Slo, TokenDist, Workload

BACKWARD_FACTOR = 2.0
"""Backward pass cost relative to the forward pass (FLOPs and bytes)."""
UNUSED_SLO = Slo(ttft_ms=1e12, tbt_ms=1e12)
"""Offline jobs have no latency SLO; the performance model's input needs one."""


@dataclass(frozen=True)
class JobPoint:
    """A job at one configuration (type, n GPUs, clock, share), alone on its GPUs."""

    job: int
    type_name: str
    gpus: int
    clock_mhz: int
    share_pct: int


@dataclass(frozen=True)
class Physics:
    """Arrays with one entry per ``JobPoint``.

    rate: work units per second of the whole job (iterations or items), alone;
    dyn_w: mean dynamic power per GPU over a period, W;
    memory_gb: memory per GPU;
    active: fraction of time the job issues kernels (phase pattern);
    bw_use: memory bandwidth used while active, fraction of the GPU's peak;
    mem_bound: fraction of active time limited by memory bandwidth;
    sm_occupancy: fraction of the GPU's SMs busy while active;
    footprint: memory per GPU over the GPU's memory.
    """

    rate: FloatArray
    dyn_w: FloatArray
    memory_gb: FloatArray
    active: FloatArray
    bw_use: FloatArray
    mem_bound: FloatArray
    sm_occupancy: FloatArray
    footprint: FloatArray


def work_units(job: TrainingJob | InferenceJob) -> float:
    """The job's work: iterations (training) or items (inference)."""
    return float(job.iterations if isinstance(job, TrainingJob) else job.items)


def idle_ms(job: TrainingJob, gpus: int) -> float:
    """Idle time per iteration on ``gpus`` GPUs (ms)."""
    total = 0.0
    for phase in job.idle_phases:
        if phase.kind == "communication":
            total += phase.ms * 2.0 * (gpus - 1) / gpus
        else:
            total += phase.ms
    return total


def training_memory_gb(problem: ColocationProblem, job: TrainingJob, gpus: int) -> float:
    """Sharded weights, gradients and optimizer state plus activations, per GPU (GB)."""
    params = problem.model_of(job).params_total_b * 1e9
    return params * job.state_bytes_per_param / gpus / 1e9 + job.activation_gb


def inference_memory_gb(problem: ColocationProblem, job: InferenceJob) -> float:
    """Weights plus the KV cache of a full batch, per GPU (GB)."""
    model = problem.model_of(job)
    context = job.prompt_tokens + job.output_tokens
    return (model.weight_bytes + job.batch * context * model.kv_bytes_per_token) / 1e9


def _op_spec(problem: ColocationProblem, point: JobPoint) -> OpSpec:
    job = problem.jobs[point.job]
    if isinstance(job, TrainingJob):
        prompt, output = float(job.sequence_tokens), 1.0
    else:
        prompt, output = job.prompt_tokens, job.output_tokens
    workload = Workload(
        name=job.name,
        model=job.model,
        rate_rps=1.0,
        prompt_tokens=TokenDist(mean=prompt),
        output_tokens=TokenDist(mean=output),
        slo=UNUSED_SLO,
    )
    gpu = problem.gpu_type(point.type_name)
    return OpSpec(
        gpu=gpu,
        model=problem.model_of(job),
        workload=workload,
        phase="both",
        clock_mhz=float(point.clock_mhz),
        sm_fraction=point.share_pct / 100.0,
        bw_fraction=1.0,
        memory_gb=problem.usable_memory_gb(point.type_name),
    )


def evaluate_points(problem: ColocationProblem, points: list[JobPoint]) -> Physics:
    """Physics of every point (vectorized over the performance model)."""
    n = len(points)
    out = {k: np.zeros(n) for k in Physics.__dataclass_fields__}
    if n == 0:
        return Physics(**out)
    p = build_params([_op_spec(problem, pt) for pt in points])
    jobs = [problem.jobs[pt.job] for pt in points]
    is_train = np.asarray([isinstance(j, TrainingJob) for j in jobs])
    gpus = np.asarray([pt.gpus for pt in points], dtype=np.float64)
    share = np.asarray([pt.share_pct for pt in points], dtype=np.float64) / 100.0
    peak_bw = p.peak_bw
    mem_total = np.asarray([problem.gpu_type(pt.type_name).memory_gb for pt in points])
    # training: 3 forward-pass equivalents over this GPU's sequences
    seqs = np.asarray(
        [
            j.tokens_per_iteration / j.sequence_tokens / pt.gpus
            if isinstance(j, TrainingJob)
            else float(j.batch)
            for j, pt in zip(jobs, points, strict=True)
        ]
    )
    fwd = prefill_pass(p, p.prompt_tokens, seqs)
    step = 1.0 + BACKWARD_FACTOR
    t_active = step * fwd.ms
    t_idle = np.asarray(
        [
            idle_ms(j, pt.gpus) if isinstance(j, TrainingJob) else 0.0
            for j, pt in zip(jobs, points, strict=True)
        ]
    )
    # inference: prefill of the batch, then output_tokens decode steps
    context = p.prompt_tokens + 0.5 * p.output_tokens
    dec = decode_pass(p, seqs, context)
    steps = p.output_tokens
    inf_ms = fwd.ms + steps * dec.ms
    bound = np.minimum(fwd.memory_ms, fwd.ms)
    inf_bound = bound + steps * np.minimum(dec.memory_ms, dec.ms)
    inf_compute = np.minimum(fwd.compute_ms, fwd.ms) + steps * np.minimum(dec.compute_ms, dec.ms)
    inf_bytes = fwd.bytes_per_gpu + steps * dec.bytes_per_gpu
    inf_energy = fwd.power_w * fwd.ms + steps * dec.power_w * dec.ms

    period_ms = np.where(is_train, t_active + t_idle, inf_ms)
    active_ms = np.where(is_train, t_active, inf_ms)
    per_period = np.where(is_train, 1.0, seqs)  # iterations (whole job) or items per GPU
    out["rate"] = np.where(is_train, 1.0, gpus) * per_period * 1e3 / period_ms
    out["active"] = active_ms / period_ms
    out["dyn_w"] = np.where(is_train, fwd.power_w * t_active, inf_energy) / period_ms
    moved = np.where(is_train, step * fwd.bytes_per_gpu, inf_bytes)
    out["bw_use"] = np.minimum(moved / (active_ms / 1e3) / peak_bw, 1.0)
    out["mem_bound"] = np.where(is_train, bound / fwd.ms, inf_bound / inf_ms)
    busy = np.where(is_train, np.minimum(fwd.compute_ms, fwd.ms) / fwd.ms, inf_compute / inf_ms)
    out["sm_occupancy"] = np.clip(share * busy, 0.0, 1.0)
    memory = np.asarray(
        [
            training_memory_gb(problem, j, pt.gpus)
            if isinstance(j, TrainingJob)
            else inference_memory_gb(problem, j)
            for j, pt in zip(jobs, points, strict=True)
        ]
    )
    out["memory_gb"] = memory
    out["footprint"] = np.minimum(memory / mem_total, 1.0)
    return Physics(**{k: np.asarray(v, dtype=np.float64) for k, v in out.items()})


def on_extra_w(problem: ColocationProblem, type_name: str, clock_mhz: int) -> float:
    """Power a GPU draws above idle when on at ``clock_mhz`` with nothing running (W)."""
    gpu = problem.gpu_type(type_name)
    return gpu_on_power_w(gpu, clock_mhz) - gpu.idle_w
