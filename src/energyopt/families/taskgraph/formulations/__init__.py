"""Task graphs on multi-GPU platforms with per-GPU DVFS: placement, order and clocks.

``model`` binds a ``kind: taskgraph`` file to the catalog (time and power of
every task on every GPU type and clock), ``schedule`` holds a schedule and its
totals, ``heft`` the fastest-schedule reference, ``bounds`` cheap lower bounds,
``cpsat`` the exact constraint-programming model, ``generators`` the bundled
graph families (tiled Cholesky and LU, stencil, random layered DAGs).
"""

from energyopt.families.taskgraph.formulations.loading import build_taskgraph, load_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, Totals, totals

__all__ = ["Schedule", "TaskGraph", "Totals", "build_taskgraph", "load_taskgraph", "totals"]
