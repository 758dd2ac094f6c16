"""The serverless family's solvers: the epoch MILP, fast sizing and decode merging."""
