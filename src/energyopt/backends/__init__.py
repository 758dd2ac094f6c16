"""Solver backends' process-wide state, below every layer that calls a solver."""
