"""Task graphs (DEFT): joint task placement, order and per-GPU clocks, with data
movement and DVFS transition costs, under five objectives.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: taskgraph`` file; ``schedule``: its plan (a schedule);
- ``formulations``: the bound graph (``model``, ``loading``), schedules and their
  totals, HEFT, lower bounds, the CP-SAT model and the bundled graph generators;
- ``solvers``: ``cpsat`` (exact, with its bound) and ``heuristic`` (clock descent
  from HEFT, with the formulation's bound);
- ``verify``: the independent schedule checker;
- ``family``: the registry entry (``TaskGraphFamily``).

Kernel time and power at a clock are the shared ``energyopt.perf.kernels``.
"""
