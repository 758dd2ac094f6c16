"""What every family's verifier returns: a list of violated constraints
(``Violation``). The verifiers themselves live in their families' packages."""

from energyopt.verify.violation import Violation

__all__ = ["Violation"]
