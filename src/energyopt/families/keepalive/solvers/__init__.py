"""The keep-alive family's solvers: the MILP and its rolling horizon, the
Lagrangian with certified bound, and the path master they share."""
