"""Solver backends, below every layer that calls a solver; one module reaches each:
``highs`` (HiGHS through highspy: every HiGHS instance, warm LPs, MIP runs),
``pyomo_highs`` (HiGHS through Pyomo, for models that are also exported) and
``cpsat`` (OR-Tools CP-SAT: every CP-SAT solver, and Pyomo models solved on it)."""
