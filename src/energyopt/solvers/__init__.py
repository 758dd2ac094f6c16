"""What every family's solvers share: the one ``Result`` type, solver presets, the
projected subgradient, MIP outcomes and model export. The solver backends are in
``energyopt.backends``; each family's solvers live in its package under
``energyopt.families``."""
