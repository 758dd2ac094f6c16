"""The task-graph family's solvers: CP-SAT (exact) and the clock-descent heuristic."""
