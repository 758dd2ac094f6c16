"""Iteration latency and energy of one serving instance at one clock, tabulated from
the roofline model (perf/forward.py) so the event loop looks them up in O(1).

Decode: every batch size 1..max_batch times a geometric grid of mean contexts
(four points per doubling, 16 to 262,144 tokens), interpolated linearly in between
(decode time is piecewise linear in the context). Prefill: every chunk size
1..chunk_tokens (up to ``max_chunk`` when the online local scheduler may take larger
chunks). Energies are the dynamic energy per GPU of the group (J).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.oppoints import op_spec
from energyopt.perf.params import build_params
from energyopt.spec.hardware import GpuType
from energyopt.spec.workload import Phase

CTX_MIN = 16.0
CTX_STEPS_PER_DOUBLING = 4
CTX_POINTS = 57  # 16 .. 16 * 2**14

ShareOption = tuple[int, str | None, float, float, float]


@dataclass(frozen=True)
class PassTable:
    """Latency (ms) and dynamic energy per GPU (J) of decode steps and prefill chunks."""

    decode_ms: list[list[float]]  # [batch - 1][context grid point]
    decode_j: list[list[float]]
    prefill_ms: list[float]  # [chunk tokens]; entry 0 is 0
    prefill_j: list[float]

    def decode(self, batch: int, context: float) -> tuple[float, float]:
        """(ms, J per GPU) of one decode step of ``batch`` sequences of mean ``context``."""
        pos = (math.log2(max(context, CTX_MIN)) - math.log2(CTX_MIN)) * CTX_STEPS_PER_DOUBLING
        k = min(int(pos), CTX_POINTS - 2)
        frac = min(pos - k, 1.0)
        row_ms = self.decode_ms[batch - 1]
        row_j = self.decode_j[batch - 1]
        ms = row_ms[k] + frac * (row_ms[k + 1] - row_ms[k])
        return ms, row_j[k] + frac * (row_j[k + 1] - row_j[k])

    def prefill(self, tokens: int) -> tuple[float, float]:
        """(ms, J per GPU) of a prefill pass over ``tokens`` tokens (<= the chunk size)."""
        return self.prefill_ms[tokens], self.prefill_j[tokens]


def context_grid() -> np.ndarray:
    """The decode table's mean-context grid (tokens)."""
    return CTX_MIN * np.power(2.0, np.arange(CTX_POINTS) / CTX_STEPS_PER_DOUBLING)


def build_pass_table(
    problem: Problem,
    workload: str,
    phase: Phase,
    gpu: GpuType,
    share: ShareOption,
    tp: int,
    clock_mhz: int,
    max_chunk: int = 0,
) -> PassTable:
    """Tables of one instance (workload phase on a GPU slice, TP size) at a clock;
    prefill chunks up to the larger of ``chunk_tokens`` and ``max_chunk`` tokens."""
    opts = problem.instance.options
    wl = problem.instance.workload(workload)
    base = build_params([op_spec(problem, wl, phase, gpu, clock_mhz, share, tp)])
    grid = context_grid()
    batches = np.arange(1, opts.max_batch + 1, dtype=np.float64)
    bb, cc = np.meshgrid(batches, grid, indexing="ij")
    p = base.take(np.zeros(bb.size, dtype=np.int64))
    dec = decode_pass(p, bb.ravel(), cc.ravel())
    shape = bb.shape
    chunks = np.arange(1, max(opts.chunk_tokens, max_chunk) + 1, dtype=np.float64)
    q = base.take(np.zeros(chunks.size, dtype=np.int64))
    pre = prefill_pass(q, chunks)
    return PassTable(
        decode_ms=dec.ms.reshape(shape).tolist(),
        decode_j=dec.energy_j.reshape(shape).tolist(),
        prefill_ms=[0.0, *pre.ms.tolist()],
        prefill_j=[0.0, *pre.energy_j.tolist()],
    )


class PassTables:
    """Tables cached by (workload, phase, GPU type, share, TP, clock)."""

    def __init__(self, problem: Problem, max_chunk: int = 0) -> None:
        self.problem = problem
        self.max_chunk = max(problem.instance.options.chunk_tokens, max_chunk)
        self._cache: dict[tuple[str, str, str, ShareOption, int, int], PassTable] = {}

    def get(
        self, workload: str, phase: Phase, gpu: GpuType, share: ShareOption, tp: int, clock: int
    ) -> PassTable:
        """The table of one instance at ``clock`` (MHz), built on first use."""
        key = (workload, phase, gpu.name, share, tp, clock)
        table = self._cache.get(key)
        if table is None:
            table = build_pass_table(
                self.problem, workload, phase, gpu, share, tp, clock, self.max_chunk
            )
            self._cache[key] = table
        return table
