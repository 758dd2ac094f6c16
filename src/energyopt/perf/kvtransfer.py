"""KV-cache transfer between a prefill and a decode instance, and its effect on TTFT.

In disaggregated serving the prefill instance computes a prompt's KV cache and
sends it to the decode instance before the first token can be followed by a
second; the transfer adds to the time to first token (TTFT) and uses link
bandwidth. This module gives

* the bytes of one request's KV cache, from the model architecture
  (``LlmModel.kv_bytes_per_token``: 2 x layers x KV heads x head dim x bytes per
  value, times the prompt tokens);
* the time to move them over a link, ``latency + bytes / bandwidth`` (one
  point-to-point send/recv), with links calibrated on measured send/recv times:

  - NVLink inside a node: Vidur's ``send_recv`` profiles with both workers on one
    node (``../shared/data/network/vidur/{h100_dgx,a100_dgx}/send_recv.csv``,
    ``devices_per_node = 2``), least-squares fit over 2 KiB .. 64 MiB;
  - network across nodes: the same files with one worker per node
    (``devices_per_node = 1``), and the nccl-tests ``sendrecv`` pairwise runs of
    two H100 clusters (``../shared/data/collectives/nccl-tests-cluster-h100/
    nccl_tests_parsed.csv``, 1 GPU per node, 32 MiB .. 16 GiB), whose median
    bandwidth is given as ``NETWORK_H100_CLUSTER01`` / ``..._CLUSTER00`` (those runs
    have no small messages, so their latency is taken from Vidur's network fit).

The serving family does not use this module (its disaggregated units keep their
transfer free); the ``serverless`` family and its simulator do.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.spec.llm import LlmModel


@dataclass(frozen=True)
class Link:
    """A point-to-point link: fixed latency (s) and sustained bandwidth (bytes/s)."""

    latency_s: float
    bandwidth_bps: float

    def transfer_s(self, n_bytes: float) -> float:
        """Time to send ``n_bytes`` bytes over the link, s (0 bytes: 0 s)."""
        if n_bytes <= 0:
            return 0.0
        return self.latency_s + n_bytes / self.bandwidth_bps


NVLINK_H100 = Link(latency_s=7.99e-6, bandwidth_bps=361.6e9)
"""NVLink inside one DGX H100: Vidur ``h100_dgx/send_recv.csv``, devices_per_node 2
(994 sizes, 2 KiB .. 64 MiB): 7.99 us + bytes / 361.6 GB/s (median error 1.6 %)."""
NETWORK_H100 = Link(latency_s=7.11e-6, bandwidth_bps=34.54e9)
"""Across two DGX H100 nodes: Vidur ``h100_dgx/send_recv.csv``, devices_per_node 1:
7.11 us + bytes / 34.54 GB/s (median error 3.2 %)."""
NVLINK_A100 = Link(latency_s=4.70e-6, bandwidth_bps=234.5e9)
"""NVLink inside one DGX A100: Vidur ``a100_dgx/send_recv.csv``, devices_per_node 2:
4.70 us + bytes / 234.5 GB/s (median error 9.4 %)."""
NETWORK_A100 = Link(latency_s=42.9e-6, bandwidth_bps=7.83e9)
"""Across two DGX A100 nodes: Vidur ``a100_dgx/send_recv.csv``, devices_per_node 1:
42.9 us + bytes / 7.83 GB/s (median error 0.7 %)."""
NETWORK_H100_CLUSTER01 = Link(latency_s=7.11e-6, bandwidth_bps=39.6e9)
"""nccl-tests sendrecv, cluster01 (10 H100 nodes), 1 GPU per node, every node pair:
median 39.6 GB/s at 4 .. 16 GiB; latency from ``NETWORK_H100``."""
NETWORK_H100_CLUSTER00 = Link(latency_s=7.11e-6, bandwidth_bps=13.5e9)
"""nccl-tests sendrecv, cluster00 (17 H100 nodes, degraded pairs), 1 GPU per node:
median 13.5 GB/s at 32 MiB .. 16 GiB; latency from ``NETWORK_H100``."""


def kv_bytes(model: LlmModel, tokens: float) -> float:
    """Bytes of the KV cache of ``tokens`` tokens of context (all layers, K and V)."""
    return model.kv_bytes_per_token * max(tokens, 0.0)


def transfer_s(model: LlmModel, prompt_tokens: float, link: Link) -> float:
    """Time to move one prompt's KV cache from prefill to decode over ``link``, s."""
    return link.transfer_s(kv_bytes(model, prompt_tokens))


def ttft_with_transfer_s(
    prefill_ttft_s: float, model: LlmModel, prompt_tokens: float, link: Link
) -> float:
    """TTFT of a disaggregated request: the prefill's TTFT plus the KV transfer, s."""
    return prefill_ttft_s + transfer_s(model, prompt_tokens, link)


def ttft_budget_s(ttft_slo_s: float, model: LlmModel, prompt_tokens: float, link: Link) -> float:
    """What the TTFT SLO leaves the prefill instance once the KV transfer is paid, s
    (negative: the transfer alone breaks the SLO)."""
    return ttft_slo_s - transfer_s(model, prompt_tokens, link)


def fit_link(sizes_bytes: np.ndarray, seconds: np.ndarray) -> Link:
    """Least-squares ``latency + bytes / bandwidth`` through measured send/recv times."""
    a = np.stack([np.ones_like(sizes_bytes), sizes_bytes], axis=1)
    (latency, per_byte), *_ = np.linalg.lstsq(a, seconds, rcond=None)
    return Link(latency_s=float(latency), bandwidth_bps=float(1.0 / per_byte))


def vidur_link(path: str | Path, devices_per_node: int) -> Link:
    """The link fitted on a Vidur ``send_recv.csv`` (times in ms, median column):
    ``devices_per_node`` 2 is one node (NVLink), 1 is two nodes (network)."""
    sizes: list[float] = []
    times: list[float] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["devices_per_node"]) == devices_per_node:
                sizes.append(float(row["size"]))
                times.append(float(row["time_stats.send_recv.median"]) / 1e3)
    return fit_link(np.asarray(sizes), np.asarray(times))


def nccl_sendrecv_bandwidth_bps(path: str | Path, cluster: str, min_bytes: float = 0.0) -> float:
    """Median out-of-place bandwidth (bytes/s) of the nccl-tests ``sendrecv`` pairwise
    runs of ``cluster`` with 1 GPU per node, at message sizes of at least ``min_bytes``."""
    rates: list[float] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if (
                row["test"] == "sendrecv_perf"
                and row["cluster"] == cluster
                and row["mode"] == "pairwise"
                and row["gpus_per_node"] == "1"
                and row["oop_time_us"] not in ("", "nan")
                and float(row["size_bytes"]) >= min_bytes
            ):
                rates.append(float(row["size_bytes"]) / (float(row["oop_time_us"]) / 1e6))
    if not rates:
        raise ValueError(f"{path}: no sendrecv rows of {cluster}")
    return float(statistics.median(rates))
