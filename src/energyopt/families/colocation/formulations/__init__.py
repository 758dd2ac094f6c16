"""The co-location family's formulations: configurations, interference, MILP and relaxation."""
