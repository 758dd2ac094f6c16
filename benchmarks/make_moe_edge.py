"""Write the bundled ``kind: moe-edge`` instances (instances/moe-edge/) from the public
routing statistics in data/moe, and the constants they rest on.

Routing:
- Mixtral-8x7B-Instruct-v0.1, all 32 layers: Fiddler's MMLU expert popularity
  (``fiddler-mixtral/expert_popularity_mmlu.csv``), one instance per MMLU subject;
- OLMoE-1B-7B-0924: AllenAI's routing counts (``olmoe-routing/expert_counts.csv``,
  ``topk_all``), measured in layers 0, 7 and 15 only; every other layer copies the
  nearest measured layer (ties to the lower one), and the file says which
  (``measured_layer``).

Host link: the achieved host-to-GPU rate of the L4 box is fitted from DeepSpeed-MII
on L4 (``fiddler-mixtral/offload_baselines/L4/*MII-long-prefill.csv``): ZeRO-3
streams every weight of Mixtral (46.7B x 2 bytes) for each forward pass, so rate =
weight bytes / seconds per one-token generation. The CPU's achieved weight-read rate
follows Fiddler's own cost ratio (``latency_cpu = 7`` vs ``latency_gpu = 70`` per
expert, src/fiddler/mixtral.py): a CPU expert-token takes a tenth of an expert fetch.
CPU power (idle 60 W, 200 W running experts), PCIe energy (10 pJ/bit) and the 256 GB
of host memory are assumptions stated in docs/formulations/moe-edge.md (no data).

Run: python benchmarks/make_moe_edge.py [--data data]
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"  # data/README.md: sources and licences
OUT = ROOT / "instances" / "moe-edge"
MIXTRAL_BYTES = 46.703e9 * 2  # models/llms/mixtral-8x7b.yaml: params_total_b x BF16
FIDDLER_CPU_TO_FETCH = 7.0 / 70.0
CPU_IDLE_W = 60.0
CPU_ACTIVE_W = 200.0
CPU_GFLOPS = 1000.0
HOST_GB = 256.0


def fitted_pcie_gbps(data: Path) -> float:
    """Host-to-GPU GB/s on the L4 box: Mixtral weight bytes / s per 1-token generation
    (DeepSpeed-MII ZeRO-3, batch 1, mean over the long-prefill rows)."""
    path = next((data / "moe/fiddler-mixtral/offload_baselines/L4").glob("*MII-long-prefill.csv"))
    with path.open() as fh:
        rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(fh)]
    times = [float(r["time"]) for r in rows if r["batch_size"] == "1" and r["output_token"] == "1"]
    return MIXTRAL_BYTES / (sum(times) / len(times)) / 1e9


def fiddler_layers(
    data: Path, subject: str, model: str = "Mixtral-8x7B-Instruct-v0.1"
) -> list[list[float]]:
    """Per layer, per expert: share of tokens selecting the expert (sums to 2)."""
    counts: dict[int, dict[int, float]] = defaultdict(dict)
    totals: dict[int, float] = {}
    with (data / "moe/fiddler-mixtral/expert_popularity_mmlu.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["model"] == model and r["mmlu_subject"] == subject:
                layer = int(r["layer"])
                counts[layer][int(r["expert"])] = float(r["count"])
                totals[layer] = float(r["layer_total"])
    return [[2.0 * counts[lay][e] / totals[lay] for e in range(8)] for lay in sorted(counts)]


def olmoe_layers(
    data: Path, domain: str, layers: int = 16, model: str = "OLMoE-1B-7B-0924"
) -> tuple[list[list[float]], list[int]]:
    """(per layer shares summing to 8, the measured layer each copies)."""
    counts: dict[int, dict[int, float]] = defaultdict(dict)
    totals: dict[int, float] = {}
    with (data / "moe/olmoe-routing/expert_counts.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["model"] == model and r["domain"] == domain and r["selection"] == "topk_all":
                layer = int(r["layer"])
                counts[layer][int(r["expert"])] = float(r["count"])
                totals[layer] = float(r["layer_total"])
    measured = sorted(counts)
    out, source = [], []
    for lay in range(layers):
        near = min(measured, key=lambda m: (abs(m - lay), m))
        out.append([8.0 * counts[near].get(e, 0.0) / totals[near] for e in range(64)])
        source.append(near)
    return out, source


def server(name: str, gpu: str, pcie: float, memory_gb: float | None = None) -> dict[str, Any]:
    g: dict[str, Any] = {"name": "gpu0", "type": gpu, "pcie_gbps": round(pcie, 3)}
    if memory_gb is not None:
        g["memory_gb"] = memory_gb
    fetch_ms_per_gb = 1.0 / pcie
    cpu_bw = 1.0 / (FIDDLER_CPU_TO_FETCH * fetch_ms_per_gb)
    return {
        "name": name,
        "gpus": [g],
        "host_memory_gb": HOST_GB,
        "cpu": {
            "expert_gflops": CPU_GFLOPS,
            "memory_bandwidth_gbps": round(cpu_bw, 3),
            "idle_w": CPU_IDLE_W,
            "active_w": CPU_ACTIVE_W,
        },
        "pcie_pj_per_bit": 10.0,
        "hop_ms": 0.02,
    }


def instance(
    name: str,
    description: str,
    model: str,
    srv: dict[str, Any],
    layers: list[list[float]],
    source: str,
    tbt_ms: float,
    cache: int,
    measured: list[int] | None = None,
) -> dict[str, Any]:
    acts = []
    for i, f in enumerate(layers):
        entry: dict[str, Any] = {"layer": i, "frequencies": [round(x, 6) for x in f]}
        if measured is not None and measured[i] != i:
            entry["measured_layer"] = measured[i]
        acts.append(entry)
    return {
        "kind": "moe-edge",
        "name": name,
        "description": description,
        "model": model,
        "server": srv,
        "batch": 1,
        "context_tokens": 512,
        "reserve_gb": 1.0,
        "cache_experts": cache,
        "activations": {"source": source, "layers": acts},
        "slo": {"tbt_ms": tbt_ms, "percentile": 90.0},
        "objective": {"kind": "energy"},
    }


def build(data: Path) -> dict[str, dict[str, Any]]:
    pcie = fitted_pcie_gbps(data)
    out: dict[str, dict[str, Any]] = {}
    fid = "Fiddler MMLU expert popularity, Mixtral-8x7B-Instruct-v0.1"
    for subject, short in (("international_law", "law"), ("college_computer_science", "cs")):
        layers = fiddler_layers(data, subject)
        for gpu, tbt in (("L4", 1500.0), ("L40S", 1000.0)):
            srv = server(f"{gpu.lower()}-box", gpu, pcie)
            out[f"mixtral-{gpu.lower()}-{short}"] = instance(
                f"mixtral-{gpu.lower()}-{short}",
                f"Mixtral-8x7B on one {gpu}, routing of MMLU {subject} "
                "(benchmarks/make_moe_edge.py)",
                "Mixtral-8x7B",
                srv,
                layers,
                f"{fid}, {subject} (data/moe/fiddler-mixtral/expert_popularity_mmlu.csv)",
                tbt,
                4,
            )
    layers = fiddler_layers(data, "international_law")
    srv = server("2xl4-box", "L4", pcie)
    srv["gpus"].append(dict(srv["gpus"][0], name="gpu1"))
    out["mixtral-2xl4-law"] = instance(
        "mixtral-2xl4-law",
        "Mixtral-8x7B on two L4s (either may hold the dense part), routing of MMLU "
        "international_law (benchmarks/make_moe_edge.py)",
        "Mixtral-8x7B",
        srv,
        layers,
        f"{fid}, international_law (data/moe/fiddler-mixtral/expert_popularity_mmlu.csv)",
        600.0,
        4,
    )
    for domain in ("github", "c4"):
        layers, measured = olmoe_layers(data, domain)
        srv = server("l4-shared", "L4", pcie, memory_gb=6.0)
        out[f"olmoe-l4-{domain}"] = instance(
            f"olmoe-l4-{domain}",
            f"OLMoE-1B-7B on an L4 with 6 GB left to it, routing of {domain} text "
            "(benchmarks/make_moe_edge.py)",
            "OLMoE-1B-7B",
            srv,
            layers,
            f"AllenAI OLMoE routing counts, {domain}, topk_all, layers 0/7/15; other layers copy "
            "the nearest measured one (data/moe/olmoe-routing/expert_counts.csv)",
            60.0,
            16,
            measured,
        )
    capped = dict(out["olmoe-l4-github"])
    capped["name"] = "olmoe-l4-github-capped"
    capped["description"] = (
        "OLMoE-1B-7B on an L4 with 6 GB left to it, GitHub routing; least time per token "
        "under a 100 W server power cap (benchmarks/make_moe_edge.py)"
    )
    capped["objective"] = {"kind": "latency", "power_cap_w": 100.0}
    out["olmoe-l4-github-capped"] = capped
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"fitted host-to-GPU rate (DeepSpeed-MII on L4): {fitted_pcie_gbps(args.data):.2f} GB/s")
    for name, inst in build(args.data).items():
        path = OUT / f"{name}.yaml"
        with path.open("w") as fh:
            fh.write("# Generated by benchmarks/make_moe_edge.py; sources and assumptions there.\n")
            yaml.safe_dump(inst, fh, sort_keys=False, width=100)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
