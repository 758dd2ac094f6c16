"""The two failures a solver dispatcher may recover from by trying another formulation.

Anything else raised while solving (a plan that fails verification, a malformed
model) is a bug and is never caught by a fallback.
"""

from __future__ import annotations

from energyopt.spec.errors import SolverError


class FormulationNotApplicable(ValueError):
    """The instance is outside what a formulation states exactly (reason in the message)."""


class BackendFailure(SolverError):
    """A solver backend did not return a usable answer (status in the message)."""
