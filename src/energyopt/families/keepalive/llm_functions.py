"""LLM serverless functions of the keep-alive instances: their warm, tepid and cold
states, from the measured ServerlessLLM load times.

Sources (data/README.md):

- cold start, resume and service times: ``serverless/serverlessllm/load_times.csv``
  (ServerlessLLM, Apache-2.0): mean ``loading_time_s`` of the SafeTensors loads in
  random order (cold start) and of the repeated, page-cached loads (tepid resume:
  the weights are in host memory), mean ``end_to_end_time_s`` (service);
- powers: ``profiles/splitwise/power_model_constant.yaml`` (Splitwise, MIT): H100
  idle 75 W and token-phase 380 W.

Assumptions (docs/formulations/keepalive.md repeats them): fp16 weights (2 bytes per
parameter) plus 8 GB of KV cache and runtime on the GPU when warm; 2 GB of host
memory per container; a warm container draws the H100's idle power in proportion to
the GPU memory it holds; a tepid one holds its weights in host DRAM at 0.125 W/GB
and 0.5 GB of GPU memory (CUDA context); loads and resumes draw the GPU's idle 75 W
plus 100 W of host CPU and NVMe; pausing copies the weights to host memory at
25 GB/s; Llama-3.1-8B and OPT-6.7B have no cached-load measurement, so their resume
time is their cold start scaled by the mean cached/random ratio of the two 32B
models; OPT-6.7B was measured on the A5000 server (its only measurement).
Times s, energies J, powers W, memory GB.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
"""The checkout's root (src/energyopt/families/keepalive/ is four levels below it)."""

GPU_IDLE_W = 75.0
"""H100-80GB idle power, W (Splitwise power_model_constant.yaml)."""
TOKEN_W = 380.0
"""H100-80GB token-phase power, W (Splitwise power_model_constant.yaml)."""
HOST_LOAD_W = 100.0
"""Host CPU and NVMe power while loading, W (assumption)."""
DRAM_W_PER_GB = 0.125
"""Power of DRAM holding data, W per GB (assumption)."""
KV_GB = 8.0
"""KV cache and runtime next to the weights on the GPU, GB (assumption)."""
HOST_GB = 2.0
"""Container runtime in host memory, GB (assumption)."""
PCIE_GB_S = 25.0
"""GPU -> host copy bandwidth when pausing, GB/s (assumption)."""
GPU_GB = 80.0
"""H100-80GB memory, GB."""
TEPID_GPU_GB = 0.5
"""GPU memory a paused container keeps (CUDA context), GB (assumption)."""

MODELS: dict[str, tuple[str, str, float]] = {
    # function: (ServerlessLLM result set, model, parameters in billions)
    "qwen3-32b": ("h100_2025", "Qwen/Qwen3-32B", 32.8),
    "deepseek-r1-distill-32b": ("h100_2025", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 32.8),
    "llama-3.1-8b": ("h100_2025", "meta-llama/Llama-3.1-8B-Instruct", 8.03),
    "opt-6.7b": ("a5000_2024", "facebook/opt-6.7b", 6.7),
}
"""The LLMs with ServerlessLLM load measurements, by function name."""


def data_dir() -> Path:
    """The public measurement tables: the checkout's data/, else a ``shared/data``
    folder beside the checkout (data/README.md)."""
    for folder in (ROOT / "data", ROOT.parent / "shared" / "data"):
        if (folder / "serverless" / "serverlessllm" / "load_times.csv").is_file():
            return folder
    raise FileNotFoundError(
        f"serverless/serverlessllm/load_times.csv not found under {ROOT / 'data'} "
        f"or {ROOT.parent / 'shared' / 'data'}"
    )


def load_times_path(data: Path | None = None) -> Path:
    """Path of ServerlessLLM's ``load_times.csv`` under ``data`` (default: data_dir())."""
    folder = data if data is not None else data_dir()
    return folder / "serverless" / "serverlessllm" / "load_times.csv"


@dataclass(frozen=True)
class ModelLoads:
    """One model's measured loads (ServerlessLLM, SafeTensors)."""

    cold_s: float
    """Mean load time in random order (a cold start), s."""
    resume_s: float
    """Mean page-cached load time (a tepid resume), s; scaled where not measured."""
    service_s: float
    """Mean end-to-end time of the generate after a random-order load, s."""
    service_samples_s: tuple[float, ...]
    """Every measured end-to-end time after a random-order load, s."""
    params_b: float
    """Parameters, billions."""


def read_model_loads(path: Path) -> dict[str, ModelLoads]:
    """Each function of MODELS with its measured loads, from a ServerlessLLM
    ``load_times.csv``. Raises ValueError naming the file and model where rows lack."""
    loads: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    e2e: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row["result_set"], row["model"], row["format"], row["scenario"])
            loads[key].append(float(row["loading_time_s"]))
            e2e[key].append(float(row["end_to_end_time_s"]))
    ratios = [
        mean(loads[(rs, m, "safetensors", "cached")])
        / mean(loads[(rs, m, "safetensors", "random")])
        for rs, m, _ in MODELS.values()
        if (rs, m, "safetensors", "cached") in loads
    ]
    if not ratios:
        raise ValueError(f"{path}: no cached SafeTensors loads of any model")
    cached_ratio = mean(ratios)
    out: dict[str, ModelLoads] = {}
    for name, (rs, model, params_b) in MODELS.items():
        key = (rs, model, "safetensors", "random")
        if key not in loads:
            raise ValueError(f"{path}: no random-order SafeTensors loads of {model} ({rs})")
        cold_s = mean(loads[key])
        cached = loads.get((rs, model, "safetensors", "cached"))
        out[name] = ModelLoads(
            cold_s=cold_s,
            resume_s=mean(cached) if cached else cold_s * cached_ratio,
            service_s=mean(e2e[key]),
            service_samples_s=tuple(e2e[key]),
            params_b=params_b,
        )
    return out


def llm_function_states(loads: ModelLoads) -> dict[str, Any]:
    """The ``warm``, ``tepid``, ``cold_start`` and ``service`` fields of a keep-alive
    function serving this model on one H100 (the assumptions in the module's
    docstring), rounded as the bundled files write them."""
    load_w = GPU_IDLE_W + HOST_LOAD_W
    weights = 2.0 * loads.params_b
    enter_s = weights / PCIE_GB_S
    warm_gb = weights + KV_GB
    return {
        "warm": {
            "gpu_memory_gb": round(warm_gb, 2),
            "host_memory_gb": HOST_GB,
            "power_w": round(GPU_IDLE_W * warm_gb / GPU_GB, 2),
        },
        "tepid": {
            "gpu_memory_gb": TEPID_GPU_GB,
            "host_memory_gb": round(weights + HOST_GB, 2),
            "power_w": round(DRAM_W_PER_GB * weights, 2),
            "enter_s": round(enter_s, 3),
            "enter_j": round(enter_s * load_w, 1),
            "resume_s": round(loads.resume_s, 3),
            "resume_j": round(loads.resume_s * load_w, 1),
        },
        "cold_start": {
            "time_s": round(loads.cold_s, 3),
            "energy_j": round(loads.cold_s * load_w, 1),
        },
        "service": {"time_s": round(loads.service_s, 3), "power_w": TOKEN_W},
    }
