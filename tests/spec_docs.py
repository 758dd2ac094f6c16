"""Small instance documents that several test modules build on, each a fresh dict
the caller may change."""

from __future__ import annotations

import random
from typing import Any


def tiny_serverless_doc(**changes: Any) -> dict[str, Any]:
    """A two-GPU serverless file (one node, one 8B chat model, two 60 s epochs of 10
    and 20 req/s); ``changes`` replace its top-level keys."""
    doc: dict[str, Any] = {
        "kind": "serverless",
        "name": "tiny",
        "gpu": "H100-SXM5-80GB",
        "epoch_s": 60,
        "nodes": [{"name": "n0", "gpus": 2}],
        "cold_start": {"bandwidth_gbps": 3.62},
        "options": {"shares_pct": [50, 100], "clocks_mhz": [1980], "max_batch": 64},
        "models": [
            {
                "name": "chat",
                "model": "Llama-3.1-8B",
                "prompt_tokens": {"mean": 1155},
                "output_tokens": {"mean": 211},
                "slo": {"ttft_ms": 1000, "tbt_ms": 50, "percentile": 90},
                "demand_rps": [10.0, 20.0],
            }
        ],
    }
    doc.update(changes)
    return doc


def collective_doc(
    nodes: list[int], collectives: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A collective file: node ``i`` is named ``n{i}`` with ``nodes[i]`` GPUs; ``extra``
    adds top-level keys."""
    return {
        "kind": "collective",
        "name": "t",
        "topology": {"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(nodes)]},
        "collectives": collectives,
        **extra,
    }


def random_health(rng: random.Random, nodes: list[int]) -> dict[str, Any]:
    """A collective file's ``health`` for ``collective_doc(nodes, ...)``: up to two
    GPUs with a degraded link (NVLink, or a NIC where there are several nodes; factor
    0.1-1) and up to two stragglers (slowdown 1-4), drawn from ``rng``."""
    gpus = [f"n{k}/{i}" for k, g in enumerate(nodes) for i in range(g)]
    kinds = ["nvlink", "nic"] if len(nodes) > 1 else ["nvlink"]
    links = [
        {"gpu": gpu, "link": rng.choice(kinds), "factor": rng.uniform(0.1, 1.0)}
        for gpu in rng.sample(gpus, rng.randint(0, min(2, len(gpus))))
    ]
    stragglers = [
        {"gpu": gpu, "slowdown": rng.uniform(1.0, 4.0)}
        for gpu in rng.sample(gpus, rng.randint(0, min(2, len(gpus))))
    ]
    return {"links": links, "stragglers": stragglers}
