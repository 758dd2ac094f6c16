"""The MoE edge family's solvers: the MILP (exact) and the Lagrangian (certified bound)."""
