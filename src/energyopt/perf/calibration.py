"""Calibration of the performance model against public measured tables.

* Splitwise ``perf_model.csv``: prompt (prefill) and token (decode) latency of
  Llama-2-70B and BLOOM-176B on DGX A100 and DGX H100 with TP 2/4/8, and average
  power (fraction of TDP) on A100.
* Splitwise ``power_model_constant.yaml``: idle, prompt and token power per GPU.
* Vidur ``*.mlp.csv``: per-layer latency of the linear operators by token count
  and TP degree.
* Vidur ``network/vidur/*_dgx/all_reduce.csv``: NCCL all-reduce latency by message
  size and number of GPUs inside one DGX node (the TP collective on its own).

* Perseus ``dvfs/perseus-a100``: time and energy of GPT-3 175B and BLOOM 176B
  pipeline-stage passes on an A100 with the SM clock locked from 1410 to 855 MHz.
* ``dvfs/h100nvl-llama7b``: time and mean power of batch-1 LLaMA-7B generation on
  an H100 NVL with the SM clock locked from 1785 to 510 MHz.

The Splitwise and Vidur tables are measured at the default clock, so they fix the
efficiency and the power at the max clock; the two ``dvfs`` sweeps fix how time and
power follow the clock (used as ratios to the value at the max clock).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from energyopt.catalog import builtin_catalog
from energyopt.perf.forward import (
    CLOCK_RESPONSE,
    ClockResponse,
    Pass,
    clock_stretch,
    decode_pass,
    kernel_pass,
    prefill_pass,
)
from energyopt.perf.params import FloatArray, OpParams, OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w, static_power_factor
from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Options
from energyopt.spec.llm import LlmModel
from energyopt.spec.workload import Slo, TokenDist, Workload

SPLITWISE_HARDWARE = {"a100-80gb": "A100-SXM4-80GB", "h100-80gb": "H100-SXM5-80GB"}
SPLITWISE_MODELS = {"llama2-70b": "Llama-2-70B", "bloom-176b": "Bloom-176B"}
VIDUR_MODELS = {
    "Llama-2-70b-hf": "Llama-2-70B",
    "Llama-2-7b-hf": "Llama-2-7B",
    "Meta-Llama-3-8B": "Meta-Llama-3-8B",
    "CodeLlama-34b-Instruct-hf": "CodeLlama-34B",
}
VIDUR_HARDWARE = {"a100": "A100-SXM4-80GB", "h100": "H100-SXM5-80GB"}
VIDUR_NETWORK = {"a100_dgx": "A100-SXM4-80GB", "h100_dgx": "H100-SXM5-80GB"}
SPLITWISE_STACK_MS: dict[str, float] = {"A100-SXM4-80GB": 0.054, "H100-SXM5-80GB": 0.0421}
"""Software latency that Splitwise's serving stack adds to every all-reduce, per doubling
of the TP size (ms; an all-reduce at TP k costs ``allreduce_latency_ms + this x log2 k``
more in its measured prompt and token times). Fitted with the efficiencies on the
Splitwise rows (``perf.fitting.fit_latency``), once the all-reduce itself is fixed by the
Vidur NCCL measurement (``fit_allreduce``). It is a property of that 2023 software
(collectives launched one by one from the host), not of the GPU, as the H100 NVL run's
host time is: the planner's passes do not carry it (docs/performance-model.md, section 10)."""
VIDUR_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


@dataclass(frozen=True)
class ErrorStats:
    """Absolute percentage errors of predictions against measurements."""

    table: str
    rows: int
    median_ape: float
    mean_ape: float
    p90_ape: float

    def line(self) -> str:
        """One report line."""
        return (
            f"{self.table}: {self.rows} rows, median {self.median_ape:.1%}, "
            f"mean {self.mean_ape:.1%}, p90 {self.p90_ape:.1%}"
        )


def error_stats(table: str, predicted: FloatArray, measured: FloatArray) -> ErrorStats:
    """APE statistics of ``predicted`` vs ``measured``."""
    ape = np.abs(predicted - measured) / np.abs(measured)
    return ErrorStats(
        table,
        int(ape.size),
        float(np.median(ape)),
        float(np.mean(ape)),
        float(np.quantile(ape, 0.9)),
    )


def _calibration_workload(model: str) -> Workload:
    return Workload(
        name="calibration",
        model=model,
        rate_rps=1.0,
        prompt_tokens=TokenDist(mean=1.0),
        output_tokens=TokenDist(mean=1.0),
        slo=Slo(ttft_ms=1e9, tbt_ms=1e9),
    )


def params_for(gpu: GpuType, model: LlmModel, tp: list[int]) -> OpParams:
    """Whole-GPU, default-clock parameters for each TP degree in ``tp``."""
    wl = _calibration_workload(model.name)
    specs = [
        OpSpec(
            gpu, model, wl, "both", gpu.default_sm_clock_mhz, 1.0, 1.0, gpu.memory_gb, k, Options()
        )
        for k in tp
    ]
    return build_params(specs)


@dataclass(frozen=True)
class SplitwiseRows:
    """Latency rows of one (hardware, model) from Splitwise perf_model.csv."""

    tp: list[int]
    prompt: FloatArray
    batch: FloatArray
    tokens: FloatArray
    prompt_ms: FloatArray
    token_ms: FloatArray
    avg_power_frac: FloatArray  # 0 where not measured


def read_splitwise(path: Path, hardware: str, model: str) -> SplitwiseRows:
    """Rows of ``perf_model.csv`` for one hardware and model name (Splitwise spelling)."""
    cols: dict[str, list[float]] = {
        k: [] for k in ("tp", "prompt", "batch", "tokens", "pt", "tt", "pw")
    }
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["hardware"] != hardware or row["model"] != model:
                continue
            cols["tp"].append(int(row["tensor_parallel"]))
            cols["prompt"].append(float(row["prompt_size"]))
            cols["batch"].append(float(row["batch_size"]))
            cols["tokens"].append(float(row["token_size"]))
            cols["pt"].append(float(row["prompt_time"]))
            cols["tt"].append(float(row["token_time"]))
            cols["pw"].append(float(row["average_power"]))
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    return SplitwiseRows(
        [int(t) for t in cols["tp"]],
        arr["prompt"],
        arr["batch"],
        arr["tokens"],
        arr["pt"],
        arr["tt"],
        arr["pw"],
    )


def with_stack(p: OpParams, stack_ms: float) -> OpParams:
    """``p`` with ``stack_ms`` x log2(TP) ms added to every all-reduce (a serving
    stack's own latency per collective; 0 at TP 1, where there is none)."""
    return p.replace(allreduce_ms=p.allreduce_ms + stack_ms * np.log2(np.maximum(p.tp, 1.0)))


def splitwise_stack_ms(gpu: GpuType) -> float:
    """Splitwise's per-all-reduce stack latency for ``gpu`` (``SPLITWISE_STACK_MS``; 0 for
    a type Splitwise did not measure)."""
    return SPLITWISE_STACK_MS.get(gpu.name, 0.0)


def predict_splitwise(
    gpu: GpuType, model: LlmModel, rows: SplitwiseRows, stack_ms: float | None = None
) -> tuple[Pass, Pass]:
    """Model prediction for every row: (batched prefill, decode step at mid context).

    The passes carry Splitwise's stack latency per all-reduce (``stack_ms``, default
    ``splitwise_stack_ms(gpu)``), since the rows were measured through that software.
    """
    stack = splitwise_stack_ms(gpu) if stack_ms is None else stack_ms
    p = with_stack(params_for(gpu, model, rows.tp), stack)
    pre = prefill_pass(p, rows.prompt, rows.batch)
    dec = decode_pass(p, rows.batch, rows.prompt + rows.tokens / 2.0)
    return pre, dec


def splitwise_average_power(
    gpu: GpuType, model: LlmModel, rows: SplitwiseRows, stack_ms: float | None = None
) -> FloatArray:
    """Predicted mean power per GPU over a whole request batch, as a fraction of TDP."""
    pre, dec = predict_splitwise(gpu, model, rows, stack_ms)
    time_ms = pre.ms + rows.tokens * dec.ms
    energy = pre.power_w * pre.ms + rows.tokens * dec.power_w * dec.ms
    on_w = gpu_on_power_w(gpu, gpu.default_sm_clock_mhz)
    return np.asarray((on_w + energy / time_ms) / gpu.tdp_w)


@dataclass(frozen=True)
class VidurRows:
    """Per-layer linear-operator latency rows from a Vidur mlp.csv."""

    tp: list[int]
    tokens: FloatArray
    layer_ms: FloatArray


def read_vidur(path: Path) -> VidurRows:
    """Sum of the per-layer operator medians (ms) by token count and TP degree."""
    tps: list[int] = []
    tokens: list[float] = []
    total: list[float] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            tps.append(int(row["num_tensor_parallel_workers"]))
            tokens.append(float(row["num_tokens"]))
            total.append(sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_LAYER_OPS))
    return VidurRows(tps, np.asarray(tokens), np.asarray(total))


def predict_vidur_layer_ms(gpu: GpuType, model: LlmModel, rows: VidurRows) -> FloatArray:
    """Model time of one layer's linear operators for ``tokens`` tokens (ms).

    The forward-pass model without the attention kernel, KV traffic and
    all-reduces, divided by the number of layers.
    """
    p = params_for(gpu, model, rows.tp)
    flops = 2.0 * p.active_params * rows.tokens
    compute_ms = flops / (p.peak_flops * p.clock_ratio * p.eff_compute * p.tp) * 1e3
    memory_ms = p.weight_bytes / (p.peak_bw * p.eff_memory * p.tp) * 1e3
    overhead = p.overhead_ms * clock_stretch(p.overhead_clock_fixed, p.clock_ratio)
    return np.asarray((np.maximum(compute_ms, memory_ms) + overhead) / p.layers)


@dataclass(frozen=True)
class AllReduceRows:
    """NCCL all-reduce measurements inside one node (Vidur ``all_reduce.csv``)."""

    workers: FloatArray  # GPUs taking part (all in one node)
    size_bytes: FloatArray  # message size
    ms: FloatArray  # median latency


def read_allreduce(path: Path) -> AllReduceRows:
    """Rows of a Vidur ``all_reduce.csv`` whose GPUs all sit in one node.

    Rows spread over nodes (``devices_per_node`` below ``num_workers``) are dropped: a
    TP group is one node's GPUs.
    """
    workers: list[float] = []
    size: list[float] = []
    ms: list[float] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["num_workers"] != row["devices_per_node"]:
                continue
            workers.append(float(row["num_workers"]))
            size.append(float(row["size"]))
            ms.append(float(row["time_stats.all_reduce.median"]))
    return AllReduceRows(np.asarray(workers), np.asarray(size), np.asarray(ms))


def predict_allreduce_ms(gpu: GpuType, rows: AllReduceRows) -> FloatArray:
    """The model's time of one all-reduce of each row (ms): the fixed latency plus the
    ring volume ``2(k-1)/k`` of the message over the achieved link bandwidth (§2), the
    bandwidth as a pass takes it (``params.build_params``: NVLink x link efficiency)."""
    p = params_for(gpu, builtin_catalog().model("Llama-2-7B"), [2])
    link_bw = float(p.link_bw[0])
    k = rows.workers
    ring = 2.0 * (k - 1.0) / k * rows.size_bytes / link_bw * 1e3
    return np.asarray(gpu.efficiency.allreduce_latency_ms + ring)


def read_parvagpu(path: Path) -> dict[tuple[int, int, int], tuple[float, float]]:
    """(MIG GPCs, batch, MPS processes) -> (throughput req/s, latency s per batch) of one
    ParvaGPU file (``sharing/parvagpu-a100``); rows with no throughput (not run) are left
    out. The throughput is one process's: batch / latency, whatever the process count."""
    out: dict[tuple[int, int, int], tuple[float, float]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            thr = float(row["Throughput"])
            if thr > 0:
                key = (
                    int(row["Mig instance"]),
                    int(row["Batch size"]),
                    int(row["Workload Number"]),
                )
                out[key] = (thr, float(row["Latency"]))
    return out


def mig_fractions(gpu: GpuType) -> dict[int, tuple[float, float]]:
    """GPCs -> (SM fraction, bandwidth fraction) of ``gpu``'s MIG profiles as the model
    takes them (``perf.oppoints.share_options``: SMs and memory of the profile over the
    GPU's; of two profiles with the same compute slices, the first listed, e.g. 1g.10gb
    before 1g.20gb)."""
    out: dict[int, tuple[float, float]] = {}
    for prof in gpu.mig_profiles:
        if prof.media_extensions or prof.compute_slices in out:
            continue
        out[prof.compute_slices] = (
            prof.sm_count / gpu.sm_count,
            prof.memory_gb / gpu.memory_gb,
        )
    return out


@dataclass(frozen=True)
class PowerConstants:
    """Splitwise constant power model of one GPU (W)."""

    idle_w: float
    prompt_w: float
    token_w: float


def read_power_constants(path: Path, hardware: str) -> PowerConstants:
    """Idle, prompt and token power (W) of one GPU from power_model_constant.yaml."""
    data = yaml.safe_load(path.read_text())
    return PowerConstants(
        float(data["idle_power"][hardware]),
        float(data["prompt_power"][hardware]),
        float(data["token_power"][hardware]),
    )


def phase_power_w(
    gpu: GpuType, model: LlmModel, tp: int = 4, stack_ms: float | None = None
) -> tuple[float, float]:
    """Predicted per-GPU power (W) of a busy prefill (4 x 2048 tokens) and decode (batch 32),
    through Splitwise's stack (``stack_ms`` per all-reduce, as ``predict_splitwise``)."""
    stack = splitwise_stack_ms(gpu) if stack_ms is None else stack_ms
    p = with_stack(params_for(gpu, model, [tp]), stack)
    pre = prefill_pass(p, np.asarray([2048.0]), 4.0)
    dec = decode_pass(p, np.asarray([32.0]), np.asarray([1024.0]))
    on_w = gpu_on_power_w(gpu, gpu.default_sm_clock_mhz)
    return on_w + float(pre.power_w[0]), on_w + float(dec.power_w[0])


# ---------------------------------------------------------------------------
# Clock sweeps (../shared/data/dvfs)


@dataclass(frozen=True)
class ClockSweep:
    """One measured pass or run at many locked SM clocks, as ratios to the max clock."""

    name: str
    clock_mhz: FloatArray  # ascending
    time_ratio: FloatArray  # t(f) / t(f_max)
    power_ratio: FloatArray  # mean board power P(f) / P(f_max)

    @property
    def energy_ratio(self) -> FloatArray:
        """E(f) / E(f_max) = time ratio x power ratio."""
        return np.asarray(self.time_ratio * self.power_ratio)

    @property
    def optimal_clock_mhz(self) -> float:
        """The measured clock of least energy (MHz)."""
        return float(self.clock_mhz[int(np.argmin(self.energy_ratio))])


@dataclass(frozen=True)
class PerseusPass:
    """A Perseus pipeline-stage pass: which model and whether forward or backward."""

    sweep: ClockSweep
    model: str  # Perseus spelling: gpt3-175b or bloom
    stage: int
    backward: bool


PERSEUS_MAX_MHZ = 1410.0
PERSEUS_MODELS: dict[str, tuple[int, int]] = {"gpt3-175b": (96, 12288), "bloom": (70, 14336)}
"""(layers, hidden size) of the Perseus models: GPT-3 175B (Brown et al., 2020, Table 2.1:
96 layers, d_model 12288) and BLOOM 176B (catalog Bloom-176B: 70 layers, hidden 14336)."""
PERSEUS_STAGES = 8
PERSEUS_TP = 8
PERSEUS_TOKENS = 2048.0
"""Assumed shape of a Perseus pass: 8 pipeline stages, TP 8 inside a stage, a microbatch of
one 2048-token sequence. Only the split of a pass into compute, memory and overhead time
matters for the ratios; with this shape the passes are compute-bound (the absolute times
of the artifact are rescaled by its notebook, so they are not compared)."""


PERSEUS_ACTIVATION_PASSES = 10.0
"""Hidden-size activation vectors read or written per token and layer by a forward pass
outside the GEMMs (two norms, two residual adds, the MLP activation, with their reads
and writes): an estimate. It sets only the pass's memory power, a few per cent of it."""


def read_perseus(path: Path) -> list[PerseusPass]:
    """Every (stage, instruction) sweep of one Perseus ``stage_profile`` CSV."""
    model = path.name.split("+", 1)[0]
    rows: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            key = (int(row["stage"]), row["instruction"])
            rows.setdefault(key, []).append(
                (float(row["frequency"]), float(row["time"]), float(row["energy"]))
            )
    out: list[PerseusPass] = []
    for (stage, instruction), values in sorted(rows.items()):
        arr = np.asarray(sorted(values))
        top = int(np.argmax(arr[:, 0]))
        time = arr[:, 1] / arr[top, 1]
        power = (arr[:, 2] / arr[:, 1]) / (arr[top, 2] / arr[top, 1])
        name = f"perseus {model} stage {stage} {instruction}"
        out.append(
            PerseusPass(
                ClockSweep(name, arr[:, 0], time, power), model, stage, instruction == "backward"
            )
        )
    return out


def _ratios(
    time_ms: FloatArray, power_w: FloatArray, top: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    t = time_ms / time_ms[top]
    p = power_w / power_w[top]
    return np.asarray(t), np.asarray(p), np.asarray(t * p)


def clock_params(gpu: GpuType, clocks_mhz: FloatArray, overhead_ms: float) -> OpParams:
    """Whole-GPU parameters of ``gpu`` at every clock, with the per-pass overhead
    ``overhead_ms`` at the max clock; the model fields are Llama-2-7B's (LLaMA-7B has
    the same architecture; a Perseus kernel pass does not read them)."""
    model = builtin_catalog().model("Llama-2-7B")
    wl = _calibration_workload(model.name)
    specs = [
        OpSpec(gpu, model, wl, "both", float(c), 1.0, 1.0, gpu.memory_gb, 1, Options())
        for c in clocks_mhz
    ]
    p = build_params(specs)
    return p.replace(overhead_ms=np.full(len(specs), overhead_ms))


def predict_perseus(
    gpu: GpuType, sweep: PerseusPass, clock: ClockResponse = CLOCK_RESPONSE
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Model (time, power, energy) ratios to the max clock of one Perseus pass.

    The pass is one kernel per GPU: the stage's dense FLOPs (2 per parameter and token,
    12 h^2 parameters per layer, plus causal attention; a backward pass twice the
    forward) over 1/TP of the stage's weight bytes (read once forward, read and their
    gradients written backward) and activation bytes (``PERSEUS_ACTIVATION_PASSES``
    2-byte hidden vectors per token and layer; twice backward), with the GPU's per-pass
    overhead. Power is board
    power: on-power at the clock (``perf.power.gpu_on_power_w``) plus the pass's
    dynamic power.
    """
    layers, hidden = PERSEUS_MODELS[sweep.model]
    stage_layers = layers / PERSEUS_STAGES
    params = 12.0 * hidden**2 * stage_layers
    fwd_flops = (
        2.0 * params * PERSEUS_TOKENS + 2.0 * stage_layers * PERSEUS_TOKENS**2 * hidden
    ) / PERSEUS_TP
    factor = 2.0 if sweep.backward else 1.0
    weight_bytes = 2.0 * params / PERSEUS_TP * factor
    act_bytes = (
        2.0 * PERSEUS_TOKENS * hidden * stage_layers * PERSEUS_ACTIVATION_PASSES / PERSEUS_TP
    ) * factor
    clocks = sweep.sweep.clock_mhz
    p = clock_params(gpu, clocks, gpu.efficiency.step_overhead_ms)
    n = len(clocks)
    out = kernel_pass(
        p, np.full(n, fwd_flops * factor), np.full(n, weight_bytes + act_bytes), clock
    )
    board = on_power_curve_w(gpu, p.clock_ratio) + out.power_w
    return _ratios(out.ms, board, int(np.argmax(clocks)))


def on_power_curve_w(gpu: GpuType, clock_ratio: FloatArray) -> FloatArray:
    """``gpu_on_power_w`` for many clock ratios (W)."""
    v0 = np.full_like(clock_ratio, gpu.power.voltage_floor)
    knee = np.full_like(clock_ratio, gpu.power.knee_fraction)
    return np.asarray(
        gpu.idle_w + gpu.power.locked_clock_w * static_power_factor(clock_ratio, v0, knee)
    )


H100NVL_STEPS = 8 * 50
"""Decode steps of one H100 NVL run: 8 prompts, up to 50 generated tokens each (taken as 50)."""
H100NVL_CONTEXT = 64.0
"""Mean context of a decode step (short prompts plus half of the 50 generated tokens)."""


def read_h100nvl(path: Path) -> ClockSweep:
    """The H100 NVL LLaMA-7B sweep: median over the runs at each clock, as ratios.

    The median of the 3 runs drops single disturbed runs (the 660 MHz run 1 takes
    3x the time at a third of the power).
    """
    runs: dict[float, list[tuple[float, float]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            runs.setdefault(float(row["freq_mhz"]), []).append(
                (float(row["total_inference_time_s"]), float(row["avg_power_w"]))
            )
    clocks = np.asarray(sorted(runs))
    time = np.asarray([np.median([r[0] for r in runs[c]]) for c in clocks])
    power = np.asarray([np.median([r[1] for r in runs[c]]) for c in clocks])
    return ClockSweep(
        "h100nvl llama-7b batch-1 decode",
        clocks,
        time / time[-1],
        power / power[-1],
    )


def read_h100nvl_top_seconds(path: Path) -> float:
    """Median total inference time at the max clock (s)."""
    times: dict[float, list[float]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            times.setdefault(float(row["freq_mhz"]), []).append(
                float(row["total_inference_time_s"])
            )
    return float(np.median(times[max(times)]))


def h100_nvl(h100_sxm: GpuType) -> GpuType:
    """The H100 NVL 94GB, for the H100 NVL sweep: the H100 SXM5 entry (same GH100 silicon,
    fitted constants) with the NVL's own figures.

    Sources: NVIDIA H100 NVL datasheet (94 GB HBM3, 3.9 TB/s, 350-400 W configurable;
    the sweep's board runs at 400 W) and the sweep's clock list (1785 MHz down to 510 MHz);
    idle 61 W is the board's idle in the sweep's source (shared data README). The voltage
    curve is the H100's, in MHz: the same die reaches the same voltage at the same clock.
    """
    scale = h100_sxm.max_sm_clock_mhz / 1785.0
    knee = min(h100_sxm.power.knee_fraction * scale, 0.99)
    static = h100_sxm.power.locked_clock_w * 400.0 / h100_sxm.tdp_w
    return h100_sxm.model_copy(
        update={
            "name": "H100-NVL-94GB",
            "memory_gb": 94.0,
            "memory_bandwidth_gbps": 3938.0,
            "max_sm_clock_mhz": 1785,
            "min_sm_clock_mhz": 510,
            "default_sm_clock_mhz": 1785,
            "tdp_w": 400.0,
            "idle_w": 61.0,
            "power_limit_min_w": 200.0,
            "power_limit_max_w": 400.0,
            "power": h100_sxm.power.model_copy(
                update={"knee_fraction": knee, "locked_clock_w": static}
            ),
        }
    )


@dataclass(frozen=True)
class HostBoundRun:
    """What the H100 NVL sweep's software adds, fitted with the sweep (not GPU constants).

    ``host_ms``: host (Python) time of one decode step, which the GPU work overlaps.
    ``gpu_overhead_ms``: GPU time per step at the max clock beyond the weight reads (the
    hundreds of small eager-mode kernels of a batch-1 step); it follows the clock as the
    model's per-pass overhead does (``ClockResponse.overhead_fixed``).
    ``window_s``: length of the power-averaging window (the mean power is diluted
    toward the on-power of the locked clock over it).
    """

    host_ms: float
    gpu_overhead_ms: float
    window_s: float


def predict_h100nvl(
    gpu: GpuType, sweep: ClockSweep, run: HostBoundRun, clock: ClockResponse = CLOCK_RESPONSE
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Model (time, power, energy) ratios of the H100 NVL sweep.

    A step takes max(host time, GPU time): the host launches kernels ahead of the GPU, so
    the clock shows only once the GPU's time (weight reads plus the clock-following
    overhead) exceeds the host's. The mean power over the window is the on-power of the
    locked clock plus the run's dynamic energy spread over the window.
    """
    p = clock_params(gpu, sweep.clock_mhz, run.gpu_overhead_ms)
    n = len(sweep.clock_mhz)
    step = decode_pass(p, np.ones(n), np.full(n, H100NVL_CONTEXT), clock)
    step_ms = np.maximum(run.host_ms, step.ms)
    total_s = H100NVL_STEPS * step_ms / 1e3
    dyn_j = H100NVL_STEPS * step.energy_j
    power = on_power_curve_w(gpu, p.clock_ratio) + dyn_j / max(run.window_s, 1e-9)
    return _ratios(total_s, power, int(np.argmax(sweep.clock_mhz)))
