"""The collective cost model against measured collective times.

Each measured point is predicted by the schedule NCCL's tuning model picks
(``nccl.nccl_choice``; the measurements ran with NCCL's default selection),
evaluated on the cost model:

- ../shared/data/network/vidur/{h100_dgx,a100_dgx}/all_reduce.csv: all-reduce,
  2-8 GPUs in one node (and 16 over two A100 nodes), 2 KiB to 64 MiB, median ms;
- the same folders' send_recv.csv: one send between 2 GPUs, in one node
  (devices_per_node 2) or in two (devices_per_node 1);
- ../shared/data/collectives/nccl-tests-cluster-h100/nccl_tests_parsed.csv:
  sendrecv between two nodes of cluster01 (1 GPU each, 32 MiB-16 GiB).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.families.collective.formulations.costmodel import flows_of, time_us
from energyopt.families.collective.formulations.model import CollectiveProblem, build_problem
from energyopt.families.collective.formulations.nccl import nccl_choice
from energyopt.families.collective.formulations.schedules import program_of
from energyopt.families.collective.spec import CollectiveFile

VIDUR = {"H100-SXM5-80GB": "h100_dgx", "A100-SXM4-80GB": "a100_dgx"}


@dataclass(frozen=True)
class Point:
    """One measurement: what ran and its median time, us."""

    table: str
    op: str
    nodes: int
    gpus_per_node: int
    bytes: int
    measured_us: float


@dataclass(frozen=True)
class TableError:
    """Prediction error over one table."""

    table: str
    points: int
    median_ape: float
    p90_ape: float

    def line(self) -> str:
        return (
            f"{self.table}: {self.points} points, median APE {100 * self.median_ape:.1f} %, "
            f"p90 {100 * self.p90_ape:.1f} %"
        )


def vidur_points(shared: Path, gpu: str, every: int = 1) -> Iterator[Point]:
    """Vidur's all_reduce and send_recv medians (every ``every``-th size)."""
    folder = shared / "network" / "vidur" / VIDUR[gpu]
    for op in ("all_reduce", "send_recv"):
        with (folder / f"{op}.csv").open() as fh:
            rows = sorted(
                csv.DictReader(fh),
                key=lambda r: (r["num_workers"], r["devices_per_node"], int(r["size"])),
            )
        groups: dict[tuple[int, int], list[dict[str, str]]] = {}
        for r in rows:
            groups.setdefault((int(r["num_workers"]), int(r["devices_per_node"])), []).append(r)
        for (workers, dpn), grp in groups.items():
            for r in grp[::every]:
                yield Point(
                    f"vidur {VIDUR[gpu]} {op} n={workers} per node={dpn}",
                    op,
                    workers // dpn,
                    dpn,
                    int(r["size"]),
                    float(r[f"time_stats.{op}.median"]) * 1e3,
                )


def nccl_tests_points(shared: Path, every: int = 1) -> Iterator[Point]:
    """cluster01's pairwise sendrecv (two nodes, one GPU each), out-of-place times."""
    path = shared / "collectives" / "nccl-tests-cluster-h100" / "nccl_tests_parsed.csv"
    with path.open() as fh:
        rows = [
            r
            for r in csv.DictReader(fh)
            if r["cluster"] == "example-cluster01"
            and r["mode"] == "pairwise"
            and r["test"] == "sendrecv_perf"
            and r["gpus_per_node"] == "1"
            and r["oop_time_us"]
        ]
    for r in rows[::every]:
        yield Point(
            "nccl-tests cluster01 sendrecv 2 nodes x 1 GPU",
            "send_recv",
            2,
            1,
            int(r["size_bytes"]),
            float(r["oop_time_us"]),
        )


def problem_for(
    gpu: str, nodes: int, per_node: int, topology: dict[str, object] | None = None
) -> CollectiveProblem:
    """A healthy ``nodes`` x ``per_node`` problem of ``gpu`` whose topology the fit
    times schedules on; the file format needs one collective, a 1-byte all-reduce,
    which the fit never uses (it times each measured size itself)."""
    topo: dict[str, object] = {
        "gpu": gpu,
        "nodes": [{"name": f"n{k}", "gpus": per_node} for k in range(nodes)],
    }
    topo.update(topology or {})
    spec = CollectiveFile.model_validate(
        {
            "kind": "collective",
            "name": "calibration",
            "topology": topo,
            "collectives": [{"op": "all_reduce", "bytes": 1}],
        }
    )
    return build_problem(spec, "<calibration>")


def predict_us(p: CollectiveProblem, op: str, nbytes: int) -> float:
    """The cost model's time of what NCCL runs for ``op`` of ``nbytes``."""
    if op == "send_recv":
        from energyopt.families.collective.formulations.nccl import nccl_channels

        prog = program_of(
            "broadcast", "direct", p.n, p.node_of, p.local_of, 0, nccl_channels(p), None
        )
        return time_us(p, flows_of(p, prog, 1), nbytes, "simple", p.gpu.max_sm_clock_mhz)
    from energyopt.families.collective.spec import Collective

    c = Collective(op="all_reduce", bytes=nbytes)
    ch = nccl_choice(p, c)
    prog = program_of("all_reduce", ch.algorithm, p.n, p.node_of, p.local_of, 0, ch.channels, None)
    return time_us(p, flows_of(p, prog, ch.chunks), nbytes, ch.protocol, p.gpu.max_sm_clock_mhz)


def errors(
    points: list[Point], gpu: str, topology: dict[str, object] | None = None
) -> list[TableError]:
    """Prediction error per table for the given topology overrides (default: calibrated)."""
    probs: dict[tuple[int, int], CollectiveProblem] = {}
    by_table: dict[str, list[float]] = {}
    for pt in points:
        key = (pt.nodes, pt.gpus_per_node)
        if key not in probs:
            probs[key] = problem_for(gpu, pt.nodes, pt.gpus_per_node, topology)
        pred = predict_us(probs[key], pt.op, pt.bytes)
        by_table.setdefault(pt.table, []).append(abs(pred - pt.measured_us) / pt.measured_us)
    return [
        TableError(t, len(v), float(np.median(v)), float(np.percentile(v, 90)))
        for t, v in by_table.items()
    ]
