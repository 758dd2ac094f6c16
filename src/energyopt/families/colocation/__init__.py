"""Co-location of jobs on shared GPUs (ElastiCo): each job as a family of
resource-performance configurations, elastic shadow prices that decompose the
allocation into per-job subproblems, and an interference predictor.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: colocation`` file and its plan;
- ``formulations``: the bound problem, configurations and their rates, the
  interference predictor (and its fit on measured pairs), the MILP and its
  relaxation, the time model and schedules;
- ``solvers``: ``exact``, ``shadow`` (elastic shadow prices), ``lagrangian``,
  ``isolated``, ``measured``, the portfolio that picks among them (``solve``),
  their common result and infeasibility diagnosis;
- ``verify`` and ``verify_measured``: the independent verifiers, on the model
  and on measured co-location throughputs;
- ``family``: the registry entry (``ColocationFamily``).
"""
