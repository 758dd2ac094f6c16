"""Calibration of the performance model against public measured tables.

* Splitwise ``perf_model.csv``: prompt (prefill) and token (decode) latency of
  Llama-2-70B and BLOOM-176B on DGX A100 and DGX H100 with TP 2/4/8, and average
  power (fraction of TDP) on A100.
* Splitwise ``power_model_constant.yaml``: idle, prompt and token power per GPU.
* Vidur ``*.mlp.csv``: per-layer latency of the linear operators by token count
  and TP degree.

All tables are measured at the default clock, so they fix the efficiency and
power constants; the clock dependence comes from the physical model.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from energyopt.perf.forward import Pass, decode_pass, prefill_pass
from energyopt.perf.params import FloatArray, OpParams, OpSpec, build_params
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


def predict_splitwise(gpu: GpuType, model: LlmModel, rows: SplitwiseRows) -> tuple[Pass, Pass]:
    """Model prediction for every row: (batched prefill, decode step at mid context)."""
    p = params_for(gpu, model, rows.tp)
    pre = prefill_pass(p, rows.prompt, rows.batch)
    dec = decode_pass(p, rows.batch, rows.prompt + rows.tokens / 2.0)
    return pre, dec


def splitwise_average_power(gpu: GpuType, model: LlmModel, rows: SplitwiseRows) -> FloatArray:
    """Predicted mean power per GPU over a whole request batch, as a fraction of TDP."""
    pre, dec = predict_splitwise(gpu, model, rows)
    time_ms = pre.ms + rows.tokens * dec.ms
    energy = pre.power_w * pre.ms + rows.tokens * dec.power_w * dec.ms
    return np.asarray((gpu.idle_w + energy / time_ms) / gpu.tdp_w)


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
    overhead = p.overhead_ms * (0.5 + 0.5 / p.clock_ratio)
    return np.asarray((np.maximum(compute_ms, memory_ms) + overhead) / p.layers)


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


def phase_power_w(gpu: GpuType, model: LlmModel, tp: int = 4) -> tuple[float, float]:
    """Predicted per-GPU power (W) of a busy prefill (4 x 2048 tokens) and decode (batch 32)."""
    p = params_for(gpu, model, [tp])
    pre = prefill_pass(p, np.asarray([2048.0]), 4.0)
    dec = decode_pass(p, np.asarray([32.0]), np.asarray([1024.0]))
    return gpu.idle_w + float(pre.power_w[0]), gpu.idle_w + float(dec.power_w[0])
