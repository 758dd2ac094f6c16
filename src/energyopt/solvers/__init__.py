"""What every family's solvers share: the one ``Result`` type, solver presets, the
projected subgradient, MIP outcomes, model export and the HiGHS (through Pyomo) and
CP-SAT runs. Each family's solvers live in its package under ``energyopt.families``."""
