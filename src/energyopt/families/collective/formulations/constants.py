"""Constants of the collective cost model, each with its source.

Calibrated values come from ``benchmarks/collective_calibrate.py`` on
``../shared/data/network/vidur/{a100_dgx,h100_dgx}/{all_reduce,send_recv}.csv`` and
``../shared/data/collectives/nccl-tests-cluster-h100/nccl_tests_parsed.csv``;
docs/formulations/collective.md (section 2) reports their errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from energyopt.families.collective.spec import Protocol

PROTOCOL_EFFICIENCY: dict[Protocol, float] = {"ll": 0.5, "ll128": 0.92, "simple": 1.0}
"""Share of link bandwidth a protocol delivers: LL carries 8 B of data per 16 B
line, LL128 120 of 128 B; NCCL's model applies 0.5 and 0.92 to ring bandwidth
(``bandwidth_refinements`` Ring/LL and Ring/LL128 in
../shared/data/collectives/nccl-tuning-model/nccl_2.30.7_tuning_constants.json)."""

PROTOCOL_STEP_US: dict[Protocol, float] = {"ll": 0.6, "ll128": 1.9, "simple": 3.4}
"""Per-step overhead of a protocol (synchronisation of one step between two GPUs),
us: NCCL's per-hop NVLink ring latencies ``hwLatencies_us.NVLINK.Ring`` (same JSON).
A model constant NCCL uses, not a measurement."""

NCCL_CHUNK_BYTES = 512 * 1024
"""Bytes per pipelined step of one channel: NCCL_BUFFSIZE default 4 MiB over
NCCL_STEPS = 8 slots (NCCL environment documentation); used to give NCCL's tree
its pipeline depth."""


@dataclass(frozen=True)
class LinkDefaults:
    """Calibrated link and rate constants of one GPU type (see the module docstring)."""

    nvlink_gbs: float
    """NVLink port bandwidth per direction, GB/s."""
    nvlink_us: float
    """NVLink one-way latency, us."""
    network_gbs: float
    """NIC bandwidth per direction, GB/s."""
    network_us: float
    """GPU -> network switch one-way latency, us (each way through the switch counts twice)."""
    channel_gbs: float
    """What one channel moves at the max SM clock, GB/s."""
    reduce_gbs: float
    """What one channel reduces at the max SM clock, GB/s."""
    launch_us: float
    """Fixed start-up cost of a collective (kernel launch and setup), us."""


CALIBRATED: dict[str, LinkDefaults] = {
    # fitted by benchmarks/collective_calibrate.py (vidur h100_dgx, nccl-tests cluster01)
    "H100-SXM5-80GB": LinkDefaults(
        nvlink_gbs=425.5,
        nvlink_us=0.5,
        network_gbs=40.0,
        network_us=5.62,
        channel_gbs=38.7,
        reduce_gbs=111.09,
        launch_us=9.26,
    ),
    # fitted by benchmarks/collective_calibrate.py (vidur a100_dgx)
    "A100-SXM4-80GB": LinkDefaults(
        nvlink_gbs=258.54,
        nvlink_us=0.5,
        network_gbs=6.02,
        network_us=19.32,
        channel_gbs=24.0,
        reduce_gbs=15.78,
        launch_us=7.84,
    ),
}
"""``channel_gbs`` is NCCL's per-channel tree bandwidth cap (``perChMaxTreeBws_GBs``,
Hopper 38.7 and Ampere 24.0 GB/s, one node) from the tuning-constants JSON; the
other fields are fitted (``nvlink_us`` is held at 0.5 us, the NVLink share of
NCCL's 0.6 us LL per-hop figure, as no table separates it). H200 and the A100
40GB take the entry of their die
(H100, A100 80GB)."""

ALIASES = {"H200-SXM-141GB": "H100-SXM5-80GB", "A100-SXM4-40GB": "A100-SXM4-80GB"}


def defaults_for(gpu: str) -> LinkDefaults | None:
    """The calibrated constants of ``gpu`` (or of its die), None if it has none."""
    return CALIBRATED.get(ALIASES.get(gpu, gpu))
