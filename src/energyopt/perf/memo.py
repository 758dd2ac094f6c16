"""SLO capacities and design batches of operating points, remembered per point.

A point's SLO capacity (req/s), its memory per GPU at that capacity (bytes) and
its decode batch there are a pure function of its parameters (``OpParams``; the
request rate is not one of them). A process that builds the tables of many
problems over the same fleet and workloads meets the same points again: POP's
parts, the infeasibility diagnosis' relaxed problem, the cells of a compiled
table (one solve per rate), presets compared on one instance. Each run of the
queueing model costs about the same for a few points as for a few hundred (its
bisections make thousands of vectorized passes), so ``capacity_and_design_batch``
evaluates only the points it has not met, all in one run, and keeps the last
``MEMO_POINTS`` results. The values are exactly those of a fresh run: the model
is elementwise, so a point's result does not depend on the others in its run.
The verifier does not read it: it recomputes every figure of the plan it checks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from energyopt.catalog.profiles import MeasuredProfile
from energyopt.perf.energy import at_max_clock, design_batch_of
from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.queueing import metrics_at, slo_capacity

MEMO_POINTS = 50_000
"""Operating points whose results are kept (about 30 MB), least recently used dropped."""


@dataclass(frozen=True)
class _Point:
    capacity_rps: float
    memory_bytes: float  # per GPU, at the capacity
    batch: float  # decode batch at the capacity (inf where unstable)
    profile: MeasuredProfile | None  # kept alive: its id is part of the key


_memo: OrderedDict[bytes, _Point] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class CapacityFigures:
    """What the queueing model says of each op at its SLO capacity."""

    capacity_rps: FloatArray
    memory_bytes: FloatArray  # per GPU, at the capacity
    design_batch: FloatArray  # decode batch at the capacity of the op at max clock (>= 1)
    own_batch: FloatArray  # decode batch at the op's own capacity (>= 1)
    ref_design_batch: FloatArray  # design batch of each reference op


def capacity_and_design_batch(params: OpParams, refs: OpParams) -> CapacityFigures:
    """SLO capacity (req/s), memory per GPU at that capacity (bytes), design batch
    and decode batch at its own capacity of each op of ``params``, and the design
    batch of each op of ``refs``.

    The design batch of an op (``perf.energy.design_batch``) is the decode batch at
    the SLO capacity of the same op at max clock, so the points evaluated are those
    of ``params``, of ``params`` at max clock and of ``refs``.
    """
    n = len(params)
    stacked = OpParams.concat([params, at_max_clock(params), refs])
    points = _points(stacked)
    capacity = np.asarray([p.capacity_rps for p in points[:n]], dtype=np.float64)
    memory = np.asarray([p.memory_bytes for p in points[:n]], dtype=np.float64)
    own = design_batch_of(np.asarray([p.batch for p in points[:n]], dtype=np.float64))
    batch = design_batch_of(np.asarray([p.batch for p in points[n:]], dtype=np.float64))
    return CapacityFigures(capacity, memory, batch[:n], own, batch[n:])


def _points(params: OpParams) -> list[_Point]:
    """The results of every op of ``params``: remembered, or from one model run."""
    keys = params.row_keys()
    found: dict[bytes, _Point] = {}
    with _lock:
        for key in keys:
            point = _memo.get(key)
            if point is not None:
                _memo.move_to_end(key)
                found[key] = point
    todo: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        if key not in found:
            todo.setdefault(key, i)
    if todo:
        rows = params.take(np.asarray(list(todo.values()), dtype=np.int64))
        capacity = slo_capacity(rows)
        at_cap = metrics_at(rows, capacity)
        fresh = {
            key: _Point(
                float(capacity[j]),
                float(at_cap.memory_bytes[j]),
                float(at_cap.batch[j]),
                rows.profile[j],
            )
            for j, key in enumerate(todo)
        }
        found.update(fresh)
        with _lock:
            _memo.update(fresh)
            while len(_memo) > MEMO_POINTS:
                _memo.popitem(last=False)
    return [found[key] for key in keys]


def forget() -> None:
    """Drop every remembered point."""
    with _lock:
        _memo.clear()
