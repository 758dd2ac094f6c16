"""The collective family's solvers: candidate selection and schedule synthesis."""
