"""Cold start of a serverless LLM instance: weights loaded onto its GPU slice.

An instance that starts loads its share of the weights (``weight_bytes / tp`` per
GPU of its group) at the stated load bandwidth; the slice is held (and billed)
while it loads. The bandwidths shipped here are measured end to end on 8x H100
SXM with NVMe (ServerlessLLM, ``../shared/data/serverless/serverlessllm/
load_times.csv``, ``h100_2025``, models loaded in random order):
Llama-3.1-8B-Instruct (16.06 GB in BF16) in 4.437 s on average with SafeTensors
(3.62 GB/s) and 0.678 s in the ServerlessLLM format (23.7 GB/s).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

SAFETENSORS_H100_GBPS = 3.62
"""SafeTensors load bandwidth, GB/s: 16.06 GB / 4.437 s (mean of 30 random-order loads
of Llama-3.1-8B-Instruct, ServerlessLLM h100_2025)."""
SLLM_H100_GBPS = 23.7
"""ServerlessLLM-format load bandwidth, GB/s: 16.06 GB / 0.678 s (same runs)."""


def load_time_s(weight_bytes: float, tp: int, bandwidth_gbps: float, fixed_s: float = 0.0) -> float:
    """Seconds to load one GPU's share of the weights of a ``tp``-GPU instance."""
    return fixed_s + weight_bytes / max(tp, 1) / (bandwidth_gbps * 1e9)


def measured_load_bandwidth_gbps(
    path: str | Path, model: str, fmt: str, weight_bytes: float, scenario: str = "random"
) -> float:
    """Load bandwidth, GB/s, of ``model`` in format ``fmt``: its weight bytes over the
    mean ``loading_time_s`` of the matching rows of a ServerlessLLM ``load_times.csv``."""
    times: list[float] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["model"] == model and row["format"] == fmt and row["scenario"] == scenario:
                times.append(float(row["loading_time_s"]))
    if not times:
        raise ValueError(f"{path}: no {scenario} loads of {model} in {fmt}")
    return weight_bytes / statistics.mean(times) / 1e9
