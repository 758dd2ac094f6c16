"""The serving family's solvers: the preset dispatcher, exact per-GPU and configuration
solves, column generation, branch-and-price, shadow prices, POP and their bounds."""
