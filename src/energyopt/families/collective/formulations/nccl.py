"""NCCL's own choice of algorithm, protocol and channels, by its documented tuning
model (NCCL 2.30.7 ``src/graph/tuning.cc``, constants and formulas transcribed in
data/collectives/nccl-tuning-model/nccl_2.30.7_tuning_constants.json).

NCCL sees the topology it detected at start-up: nominal link bandwidths, no
health factors, no stragglers. Only Ring and Tree are modelled (NVLS needs the
NVSwitch's in-network reduction, CollNet a SHARP network, PAT one GPU per node;
none is part of the cost model), so this is NCCL with NCCL_ALGO=Ring,Tree.
All-to-all is point-to-point in NCCL (no algorithm choice): ``direct``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from energyopt.families.collective.formulations.constants import NCCL_CHUNK_BYTES
from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.spec import MAX_CHUNKS, Algorithm, Collective, Protocol

DATA = Path(__file__).resolve().parents[5] / "data"  # the checkout's data/ (data/README.md)
CONSTANTS_FILE = DATA / "collectives" / "nccl-tuning-model" / "nccl_2.30.7_tuning_constants.json"

_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
MAX_NCCL_CHANNELS = 32
"""NCCL's MAXCHANNELS for Ring/Tree on one communicator."""

# The constants NCCL's selection uses, as transcribed in CONSTANTS_FILE (kept here
# so the package works without the shared data; tests compare them with the file).
BASE_US = {
    "Tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
    "Ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
}
HW_US = {
    "NVLINK": {
        "Tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
        "Ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
    },
    "NET": {
        "Tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
        "Ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
    },
}
LL_MAX_GBS = {"Ampere": (87.7, 22.5, 19.0), "Hopper": (141.0, 45.0, 35.0)}
PER_CH_RING_LL128_GBS = {"Ampere": (20.0, 20.0, 20.0), "Hopper": (36.7, 36.7, 36.7)}
PER_CH_TREE_GBS = {"Ampere": (24.0, 23.6, 17.8), "Hopper": (38.7, 41.4, 36.0)}
PER_CH_TREE_LL128_GBS = {"Ampere": (20.0, 20.0, 20.0), "Hopper": (36.7, 36.7, 29.0)}
TREE_CORRECTION = {
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
}
NET_OVERHEAD_US = 1.0
"""netOverhead on an Intel host (x3 for Simple)."""


@dataclass(frozen=True)
class NcclChoice:
    """What NCCL's model picks for one collective, and the time it predicts."""

    algorithm: Algorithm
    protocol: Protocol
    channels: int
    chunks: int
    predicted_us: float


def arch_of(p: CollectiveProblem) -> str:
    """NCCL's compute-capability row of the GPU."""
    return "Hopper" if p.gpu.name.startswith(("H100", "H200")) else "Ampere"


def nccl_channels(p: CollectiveProblem) -> int:
    """Channels NCCL's topology search settles on: enough for the NVLink port at
    one channel's rate, at most MAX_NCCL_CHANNELS (nominal links)."""
    return max(1, min(MAX_NCCL_CHANNELS, math.ceil(p.rates.nvlink_gbs / p.rates.channel_gbs)))


def _times(p: CollectiveProblem, c: Collective) -> dict[tuple[str, str], float]:
    """NCCL's predicted time of every enabled (algorithm, protocol), us."""
    arch = arch_of(p)
    n = p.n
    nodes = p.n_nodes
    col = 0 if nodes == 1 else 1 if nodes == 2 else 2
    nc = nccl_channels(p)
    ppn = n // nodes
    bw_intra = p.rates.nvlink_gbs / nc
    bw_inter = p.rates.network_gbs * ppn / nc
    bw_ch = bw_intra if nodes == 1 else min(bw_intra, bw_inter)
    out: dict[tuple[str, str], float] = {}
    algos = ["Ring", "Tree"] if c.op == "all_reduce" else ["Ring"]
    for a in algos:
        for pr in ("LL", "LL128", "Simple"):
            bus = nc * bw_ch
            if a == "Ring":
                if pr == "LL":
                    bus = min(LL_MAX_GBS[arch][col], bus * 0.5)
                elif pr == "LL128":
                    bus = min(bus * 0.92, nc * PER_CH_RING_LL128_GBS[arch][col])
            else:
                bus = min(bus * 0.92, nc * PER_CH_TREE_GBS[arch][col])
                if pr == "LL":
                    bus = min(bus / 3.8, LL_MAX_GBS[arch][col])
                elif pr == "LL128":
                    bus = min(
                        bus * (7 / 9 if nodes == 1 else 120 / 128),
                        nc * PER_CH_TREE_LL128_GBS[arch][col],
                    )
                idx = max(0, min(23, int(math.log2(max(1, c.bytes >> 6)))))
                bus *= TREE_CORRECTION[pr][idx]
            if a == "Ring":
                nsteps = 2 * (n - 1) if c.op == "all_reduce" else n - 1
                inter_steps = 2 * (nodes - 1) if c.op == "all_reduce" else nodes - 1
                alg = bus * n / max(nsteps, 1)
                intra = HW_US["NVLINK"]["Ring"][pr]
                if nodes > 1:
                    intra = max(intra, NET_OVERHEAD_US * (3 if pr == "Simple" else 1))
                lat = (
                    BASE_US["Ring"][pr]
                    + (nsteps - inter_steps) * intra
                    + inter_steps * HW_US["NET"]["Ring"][pr]
                )
                if (
                    pr == "Simple"
                    and c.op == "all_reduce"
                    and nodes > 1
                    and c.bytes / (nc * n) >= 64
                ):
                    lat *= 1.4
            else:
                alg = bus * 0.5
                lat = BASE_US["Tree"][pr] + 2 * (
                    (n / nodes - 1) * HW_US["NVLINK"]["Tree"][pr]
                    + math.log2(nodes) * HW_US["NET"]["Tree"][pr]
                )
            out[(a, pr)] = lat + c.bytes / (1000.0 * alg)
    return out


def nccl_choice(p: CollectiveProblem, c: Collective) -> NcclChoice:
    """The (algorithm, protocol) NCCL's model predicts fastest, as one of our schedules."""
    nc = nccl_channels(p)
    if c.op == "all_to_all":
        return NcclChoice("direct", "simple", nc, 1, float("nan"))
    times = _times(p, c)
    (a, pr), t = min(times.items(), key=lambda kv: kv[1])
    proto: Protocol = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}[pr]  # type: ignore[assignment]
    chunks = max(1, min(MAX_CHUNKS // 4, c.bytes // (nc * NCCL_CHUNK_BYTES)))
    if a == "Ring":
        return NcclChoice("ring", proto, nc, int(chunks) if c.op == "broadcast" else 1, t)
    return NcclChoice("tree", proto, nc, int(chunks), t)


@lru_cache(maxsize=1)
def transcribed() -> dict[str, Any]:
    """The JSON of NCCL's constants in data/ (for the test that checks the copy above)."""
    data: dict[str, Any] = json.loads(CONSTANTS_FILE.read_text())
    return data
