"""Task-graph families: tiled Cholesky and LU, a stencil with halo exchanges, random
layered DAGs. Each returns a ``TaskGraphFile`` (write it with ``spec.io.dump``).

Tile kernels carry the FLOPs and device-memory bytes of the BLAS/LAPACK call a
tiled runtime (CUDASTF, StarPU, PaRSEC) launches per tile; a task's
``compute_efficiency`` is the precision's share of the BF16 tensor peak times
the kernel's achieved share of that precision's peak:

- precision shares of the BF16 dense tensor peak on Ada (L40S, L4):
  TF32 tensor 1/2, FP32 CUDA cores 1/4, FP64 1/256 (NVIDIA L40S datasheet:
  BF16 362.05, TF32 183, FP32 91.6 TFLOPS; L4 datasheet: BF16 121, TF32 60,
  FP32 30.3 TFLOPS; Ada FP64 runs at 1/64 of FP32);
- kernel shares: GEMM 0.9, SYRK 0.8, TRSM 0.6, GETRF/POTRF panel 0.25 (the
  panel factorizations are latency-bound and reach a fraction of GEMM speed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from energyopt.families.taskgraph.spec import TaskGraphFile
from energyopt.spec.io import parse

PRECISION_SHARE: dict[str, float] = {"bf16": 1.0, "tf32": 0.5, "fp32": 0.25, "fp64": 1 / 256}
PRECISION_BYTES: dict[str, int] = {"bf16": 2, "tf32": 4, "fp32": 4, "fp64": 8}
KERNEL_SHARE: dict[str, float] = {
    "gemm": 0.9,
    "syrk": 0.8,
    "trsm": 0.6,
    "potrf": 0.25,
    "getrf": 0.25,
}
LAUNCH_MS = 0.01
"""Launch and stream-synchronisation cost of one tile task at the max clock (ms)."""


def platform(gpu_type: str, count: int, prefix: str = "gpu") -> list[dict[str, Any]]:
    """``count`` GPUs of one catalog type, named ``gpu0``, ``gpu1``, ..."""
    return [{"name": f"{prefix}{i}", "type": gpu_type} for i in range(count)]


def taskgraph_file(
    name: str,
    tasks: list[dict[str, Any]],
    edges: list[dict[str, Any]],
    gpus: list[dict[str, Any]],
    **extra: Any,
) -> TaskGraphFile:
    """Assemble and validate a ``kind: taskgraph`` file from its parts."""
    data: dict[str, Any] = {"kind": "taskgraph", "name": name, "gpus": gpus}
    data.update(extra)
    data["tasks"] = tasks
    data["edges"] = edges
    return parse(TaskGraphFile, data, f"<generated {name}>")


class _Tiles:
    """Tile data flow: each task reads some tiles and updates one; edges follow the
    last writer of every tile it reads (read-after-write on in-place updates)."""

    def __init__(self, tile: int, precision: str) -> None:
        self.tile = tile
        self.precision = precision
        self.tile_bytes = float(tile * tile * PRECISION_BYTES[precision])
        self.tasks: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []
        self.last: dict[tuple[int, int], str] = {}

    def add(
        self,
        name: str,
        kernel: str,
        flops: float,
        reads: list[tuple[int, int]],
        writes: tuple[int, int],
    ) -> None:
        touched = len(reads) + 1 + (writes not in reads)  # read inputs, read + write output
        self.tasks.append(
            {
                "name": name,
                "kernel": kernel,
                "flops": float(flops),
                "bytes": touched * self.tile_bytes,
                "compute_efficiency": PRECISION_SHARE[self.precision] * KERNEL_SHARE[kernel],
                "launch_ms": LAUNCH_MS,
            }
        )
        sources = {self.last[t] for t in [*reads, writes] if t in self.last}
        for src in sorted(sources):
            self.edges.append({"src": src, "dst": name, "bytes": self.tile_bytes})
        self.last[writes] = name


def cholesky(
    tiles: int,
    tile: int,
    gpus: list[dict[str, Any]],
    precision: str = "fp32",
    name: str | None = None,
    **extra: Any,
) -> TaskGraphFile:
    """Right-looking tiled Cholesky (lower) of a ``tiles`` x ``tiles`` matrix of
    ``tile`` x ``tile`` tiles: POTRF, TRSM, SYRK, GEMM tasks."""
    b = float(tile)
    t = _Tiles(tile, precision)
    for k in range(tiles):
        t.add(f"potrf_{k}", "potrf", b**3 / 3, [], (k, k))
        for i in range(k + 1, tiles):
            t.add(f"trsm_{k}_{i}", "trsm", b**3, [(k, k)], (i, k))
        for i in range(k + 1, tiles):
            t.add(f"syrk_{k}_{i}", "syrk", b**3, [(i, k)], (i, i))
            for j in range(k + 1, i):
                t.add(f"gemm_{k}_{i}_{j}", "gemm", 2 * b**3, [(i, k), (j, k)], (i, j))
    label = name or f"cholesky-{tiles}x{tiles}-b{tile}"
    return taskgraph_file(label, t.tasks, t.edges, gpus, **extra)


def lu(
    tiles: int,
    tile: int,
    gpus: list[dict[str, Any]],
    precision: str = "fp32",
    name: str | None = None,
    **extra: Any,
) -> TaskGraphFile:
    """Tiled LU without pivoting: GETRF, row and column TRSM, GEMM tasks."""
    b = float(tile)
    t = _Tiles(tile, precision)
    for k in range(tiles):
        t.add(f"getrf_{k}", "getrf", 2 * b**3 / 3, [], (k, k))
        for j in range(k + 1, tiles):
            t.add(f"trsmr_{k}_{j}", "trsm", b**3, [(k, k)], (k, j))
        for i in range(k + 1, tiles):
            t.add(f"trsmc_{k}_{i}", "trsm", b**3, [(k, k)], (i, k))
        for i in range(k + 1, tiles):
            for j in range(k + 1, tiles):
                t.add(f"gemm_{k}_{i}_{j}", "gemm", 2 * b**3, [(i, k), (k, j)], (i, j))
    label = name or f"lu-{tiles}x{tiles}-b{tile}"
    return taskgraph_file(label, t.tasks, t.edges, gpus, **extra)


def stencil(
    parts: int,
    steps: int,
    cells: int,
    gpus: list[dict[str, Any]],
    name: str | None = None,
    **extra: Any,
) -> TaskGraphFile:
    """3-D 7-point stencil, slab-partitioned into ``parts`` slabs of ``cells`` FP32
    cells, ``steps`` time steps. Task (s, p) reads and writes its slab (8 bytes
    and 8 FLOPs per cell: memory-bound) and needs the halo planes of slabs p-1
    and p+1 from step s-1 (one plane = cells^(2/3) cells of 4 bytes); its own
    slab moves whole (4 bytes per cell) only if step s-1 ran elsewhere."""
    plane = 4.0 * math.ceil(cells ** (2.0 / 3.0))
    tasks: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for s in range(steps):
        for p in range(parts):
            tasks.append(
                {
                    "name": f"step{s}_part{p}",
                    "kernel": "stencil",
                    "flops": 8.0 * cells,
                    "bytes": 8.0 * cells,
                    "compute_efficiency": PRECISION_SHARE["fp32"],
                    "launch_ms": LAUNCH_MS,
                }
            )
            if s == 0:
                continue
            edges.append(
                {"src": f"step{s - 1}_part{p}", "dst": f"step{s}_part{p}", "bytes": 4.0 * cells}
            )
            for q in (p - 1, p + 1):
                if 0 <= q < parts:
                    edges.append(
                        {"src": f"step{s - 1}_part{q}", "dst": f"step{s}_part{p}", "bytes": plane}
                    )
    label = name or f"stencil-{parts}x{steps}"
    return taskgraph_file(label, tasks, edges, gpus, **extra)


def layered(
    layers: int,
    width: int,
    gpus: list[dict[str, Any]],
    seed: int = 0,
    fan_in: int = 3,
    name: str | None = None,
    **extra: Any,
) -> TaskGraphFile:
    """Random layered DAG: ``layers`` layers of ``width`` tasks; every task of layer
    l > 0 reads from 1..``fan_in`` random tasks of layer l-1 and, with
    probability 0.2, one of an earlier layer. Work is log-uniform: 1e9..1e11
    FLOPs, 1e7..1e9 bytes (BF16 share 0.25..1), so some tasks are compute-bound
    and some memory-bound; edges carry 1e5..1e8 bytes."""
    rng = np.random.default_rng(seed)
    tasks: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for lay in range(layers):
        for w in range(width):
            name_t = f"t{lay}_{w}"
            tasks.append(
                {
                    "name": name_t,
                    "kernel": "random",
                    "flops": float(10 ** rng.uniform(9, 11)),
                    "bytes": float(10 ** rng.uniform(7, 9)),
                    "compute_efficiency": float(rng.uniform(0.25, 1.0)),
                    "launch_ms": LAUNCH_MS,
                }
            )
            if lay == 0:
                continue
            k = int(rng.integers(1, fan_in + 1))
            srcs = {
                f"t{lay - 1}_{int(x)}" for x in rng.choice(width, size=min(k, width), replace=False)
            }
            if lay >= 2 and rng.random() < 0.2:
                srcs.add(f"t{int(rng.integers(0, lay - 1))}_{int(rng.integers(0, width))}")
            for src in sorted(srcs):
                edges.append({"src": src, "dst": name_t, "bytes": float(10 ** rng.uniform(5, 8))})
    label = name or f"layered-{layers}x{width}-s{seed}"
    return taskgraph_file(label, tasks, edges, gpus, **extra)
