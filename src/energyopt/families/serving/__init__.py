"""LLM serving on a GPU fleet (Festina): joint request placement, SM partitioning
and GPU clock under TTFT/TBT SLOs and power caps.

The fleet it decides on (``spec.instance``, ``spec.plan``, ``catalog.problem``)
is the shared fleet model, which the simulator core, the online control and
NVML use too. This package is the deciding, each part importing only the
shared layers and this package:

- ``formulations``: the per-GPU model and the configuration (pattern)
  formulation: classes, columns, knapsack pricing, the master, unit covers;
- ``solvers``: the dispatcher (``solve``) over the presets in ``solvers/*.toml``,
  the per-GPU backends (``backend``), the configuration solve, column generation,
  branch-and-price, shadow prices, POP, their bounds and infeasibility diagnosis;
- ``verify``: the independent plan checker and the plan's cost (``evaluate_plan``);
- ``tables``: plan tables and ``compile_table`` (operating-point tables are the
  shared ``energyopt.tables.oppoints``);
- ``planners``, ``loop``, ``remap``, ``loop_report``, ``plots``: trace-driven
  evaluation of epoch planners against the baselines (docs/evaluation.md);
- ``report``: a problem and its plan as text;
- ``family``: the registry entry (``ServingFamily``).
"""
