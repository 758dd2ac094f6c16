"""Small instance documents that several test modules build on, each a fresh dict
the caller may change."""

from __future__ import annotations

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
