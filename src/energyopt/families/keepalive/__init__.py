"""Container keep-alive (warm / tepid / cold) and placement of serverless functions.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: keepalive`` file (functions, nodes, trace) and its plan;
- ``formulations``: the arc-flow keep-alive MILP, the expected-cost model and the
  table policy;
- ``solvers``: ``milp``, ``rolling`` (``solvers.milp``), ``lagrangian`` and the path
  master (``solvers.paths``, ``solvers.programmes``);
- ``verify``: the independent verifier, which recomputes a plan's energy;
- ``sim``: replay of a trace under a policy (fixed, hybrid histogram, table, timed);
- ``function_workload``, ``azure_functions``, ``llm_functions``: generated function
  loads with the statistics of production platforms, the Azure 2021 trace format;
- ``family``: the registry entry (``KeepAliveFamily``).
"""
