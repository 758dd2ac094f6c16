"""MoE edge serving (``kind: moe-edge``): the bound problem, per-configuration costs
and the placement MILP (docs/formulations/moe-edge.md)."""
