"""Sparsity-aware MoE serving on edge servers: expert placement between GPU and
host memory by activation frequency, offloading, and the GPU clock.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: moe-edge`` file and its plan;
- ``formulations``: the bound problem (``model``), the MILP with its secant
  power cuts (``milp``) and the figures it reports (``figures``);
- ``solvers``: ``milp`` (exact) and ``lagrangian`` (certified bound);
- ``verify``: the independent verifier, which recomputes latency and energy;
- ``sim``: replay of routing traces; ``tables``: the compiled lookup table;
- ``family``: the registry entry (``MoeEdgeFamily``).
"""
