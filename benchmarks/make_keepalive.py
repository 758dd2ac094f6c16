"""Write instances/keepalive/azure-llm-2nodes.yaml from the shared reference data.

Sources (read from data/, see data/README.md):

- arrivals: traces/azure-llm-2023-conv.csv (Azure LLM inference trace 2023,
  CC-BY-4.0), one hour, split into one request stream per model by request class
  (rules in ``SPLIT``), counted per 300 s window; the second file,
  azure-llm-2nodes-histogram.yaml, gives each stream as the histogram of its
  inter-arrival times in 1 s bins instead;
- cold start, resume and service times: serverless/serverlessllm/load_times.csv
  (ServerlessLLM, Apache-2.0): mean ``loading_time_s`` of the SafeTensors loads in
  random order (cold start) and of the repeated, page-cached loads (tepid resume:
  the weights are in host memory), mean ``end_to_end_time_s`` (service);
- powers: profiles/splitwise/power_model_constant.yaml (Splitwise, MIT): H100 idle
  75 W and token-phase 380 W.

Assumptions (docs/formulations/keepalive.md repeats them): fp16 weights (2 bytes
per parameter) plus 8 GB of KV cache and runtime on the GPU when warm; 2 GB of host
memory per container; a warm container draws the H100's idle power in proportion
to the GPU memory it holds; a tepid one holds its weights in host DRAM at
0.125 W/GB and 0.5 GB of GPU memory (CUDA context); loads and resumes draw the
GPU's idle 75 W plus 100 W of host CPU and NVMe; pausing copies the weights to
host memory at 25 GB/s; Llama-3.1-8B and OPT-6.7B have no cached-load
measurement, so their resume time is their cold start scaled by the mean
cached/random ratio of the two 32B models; OPT-6.7B was measured on the A5000
server (its only measurement).

Run: python benchmarks/make_keepalive.py [DATA_DIR]
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from statistics import mean

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "instances" / "keepalive" / "azure-llm-2nodes.yaml"
OUT_HISTOGRAM = ROOT / "instances" / "keepalive" / "azure-llm-2nodes-histogram.yaml"
HISTOGRAM_BIN_S = 1.0
WINDOW_S = 300.0
WINDOWS = 12
GPU_IDLE_W = 75.0  # Splitwise power_model_constant.yaml, h100-80gb idle
TOKEN_W = 380.0  # Splitwise power_model_constant.yaml, h100-80gb token phase
HOST_LOAD_W = 100.0  # assumption: host CPU and NVMe while loading
DRAM_W_PER_GB = 0.125  # assumption: DRAM holding tepid weights
KV_GB = 8.0  # assumption: KV cache and runtime next to the weights
HOST_GB = 2.0  # assumption: container runtime in host memory
PCIE_GB_S = 25.0  # assumption: GPU -> host copy when pausing
GPU_GB = 80.0

MODELS = {
    # function: (ServerlessLLM result set and model, parameters in billions)
    "qwen3-32b": ("h100_2025", "Qwen/Qwen3-32B", 32.8),
    "deepseek-r1-distill-32b": ("h100_2025", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 32.8),
    "llama-3.1-8b": ("h100_2025", "meta-llama/Llama-3.1-8B-Instruct", 8.03),
    "opt-6.7b": ("a5000_2024", "facebook/opt-6.7b", 6.7),
}


def split(context: int, generated: int, index: int) -> str | None:
    """The function a trace request goes to (None: dropped)."""
    if context >= 4096:
        return "qwen3-32b"
    if generated >= 500:
        return "deepseek-r1-distill-32b"
    if context < 256:
        return "llama-3.1-8b"
    return "opt-6.7b" if index % 50 == 0 else None


def main(data: Path) -> None:
    loads: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    e2e: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    with open(data / "serverless" / "serverlessllm" / "load_times.csv") as fh:
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
    cached_ratio = mean(ratios)
    counts: dict[str, list[int]] = {name: [0] * WINDOWS for name in MODELS}
    times: dict[str, list[float]] = {name: [] for name in MODELS}
    with open(data / "traces" / "azure-llm-2023-conv.csv") as fh:
        rows = list(csv.DictReader(fh))
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    for i, row in enumerate(rows):
        name = split(int(row["ContextTokens"]), int(row["GeneratedTokens"]), i)
        if name is None:
            continue
        t = (datetime.fromisoformat(row["TIMESTAMP"][:26]) - t0).total_seconds()
        w = int(t // WINDOW_S)
        if w < WINDOWS:
            counts[name][w] += 1
            times[name].append(t)
    load_w = GPU_IDLE_W + HOST_LOAD_W
    functions = []
    for name, (rs, model, params_b) in MODELS.items():
        weights = 2.0 * params_b
        cold_s = mean(loads[(rs, model, "safetensors", "random")])
        cached = loads.get((rs, model, "safetensors", "cached"))
        resume_s = mean(cached) if cached else cold_s * cached_ratio
        enter_s = weights / PCIE_GB_S
        warm_gb = weights + KV_GB
        functions.append(
            {
                "name": name,
                "warm": {
                    "gpu_memory_gb": round(warm_gb, 2),
                    "host_memory_gb": HOST_GB,
                    "power_w": round(GPU_IDLE_W * warm_gb / GPU_GB, 2),
                },
                "tepid": {
                    "gpu_memory_gb": 0.5,
                    "host_memory_gb": round(weights + HOST_GB, 2),
                    "power_w": round(DRAM_W_PER_GB * weights, 2),
                    "enter_s": round(enter_s, 3),
                    "enter_j": round(enter_s * load_w, 1),
                    "resume_s": round(resume_s, 3),
                    "resume_j": round(resume_s * load_w, 1),
                },
                "cold_start": {"time_s": round(cold_s, 3), "energy_j": round(cold_s * load_w, 1)},
                "service": {
                    "time_s": round(mean(e2e[(rs, model, "safetensors", "random")]), 3),
                    "power_w": TOKEN_W,
                },
                "arrivals": counts[name],
            }
        )
    doc = {
        "kind": "keepalive",
        "name": "azure-llm-2nodes",
        "description": (
            "Four LLM functions on two one-H100 nodes for one hour of the Azure LLM "
            "inference trace 2023 (conversation), split per model by request class; "
            "load times ServerlessLLM, powers Splitwise (benchmarks/make_keepalive.py)"
        ),
        "window_s": WINDOW_S,
        "slo": {"start_latency_s": 15.0, "percentile": 99.0},
        "objective": {"kind": "energy", "max_cold_start_rate": 0.05},
        "nodes": [
            {
                "name": f"h100-{k}",
                "gpu_memory_gb": GPU_GB,
                "host_memory_gb": 512.0,
                "power_budget_w": 1000.0,
            }
            for k in ("a", "b")
        ],
        "functions": functions,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    header = "# Generated by benchmarks/make_keepalive.py; sources and assumptions there.\n"
    OUT.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    print(f"wrote {OUT}")
    for fn in functions:
        gaps = [b - a for a, b in zip(times[fn["name"]], times[fn["name"]][1:], strict=False)]
        bins = [0] * (int(max(gaps) // HISTOGRAM_BIN_S) + 1)
        for g in gaps:
            bins[int(g // HISTOGRAM_BIN_S)] += 1
        del fn["arrivals"]
        fn["inter_arrivals"] = {"bin_s": HISTOGRAM_BIN_S, "counts": bins, "windows": WINDOWS}
    doc["name"] = "azure-llm-2nodes-histogram"
    doc["description"] = (
        f"{doc['description']}; each forecast as its inter-arrival histogram "
        f"({HISTOGRAM_BIN_S:g} s bins)"
    )
    OUT_HISTOGRAM.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    print(f"wrote {OUT_HISTOGRAM}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "data")
