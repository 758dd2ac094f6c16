"""The co-location family's solvers: exact, shadow prices, Lagrangian and their portfolio."""
