"""Collective-communication schedules chosen by runtime state (Theseus): message
size, link health and stragglers, switched consistently on all ranks.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: collective`` file and its plan (a policy per state);
- ``formulations``: the bound problem (``model``), the cost model and its
  calibration on nccl-tests logs, NCCL's tuning constants (``nccl``), candidate
  schedules and the synthesis MILP;
- ``solvers``: ``select`` (candidate selection, NCCL and ring baselines, the
  bound) and ``synth`` (schedule synthesis);
- ``verify``: the independent verifier; ``sim``: replay of runtime states;
  ``tables``: the runtime policy table and the NCCL tuner config;
- ``family``: the registry entry (``CollectiveFamily``).
"""
