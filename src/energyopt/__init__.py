"""energyopt: energy-optimal operation of GPU fleets.

Decides where work runs, how each GPU's SMs are partitioned and at which clock
each GPU runs, so that energy is minimal while latency SLOs and power caps hold.

The public API (docs/api.md), the same for every kind of problem::

    import energyopt

    problem = energyopt.load("instances/quickstart.yaml")
    result = energyopt.solve(problem, time_limit=10)
    assert energyopt.verify(problem, result).ok

``import energyopt`` imports nothing else: each name below is imported on first use
(``energyopt.api``; the exceptions from ``energyopt.spec.errors``).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from energyopt.api import (
        Result,
        Status,
        Verification,
        Violation,
        compile,
        evaluate,
        kinds,
        load,
        report,
        solve,
        verify,
    )
    from energyopt.spec.errors import (
        EnergyoptError,
        InputError,
        MissingFileError,
        NvmlError,
        SolverError,
        SpecError,
    )

_ERRORS = (
    "EnergyoptError",
    "InputError",
    "MissingFileError",
    "NvmlError",
    "SolverError",
    "SpecError",
)
"""Names from ``energyopt.spec.errors`` (no import beyond that module's package)."""

_API = (
    "Result",
    "Status",
    "Verification",
    "Violation",
    "compile",
    "evaluate",
    "kinds",
    "load",
    "report",
    "solve",
    "verify",
)
"""Names from ``energyopt.api`` (which imports every family)."""

__all__ = [
    "EnergyoptError",
    "InputError",
    "MissingFileError",
    "NvmlError",
    "Result",
    "SolverError",
    "SpecError",
    "Status",
    "Verification",
    "Violation",
    "__version__",
    "compile",
    "evaluate",
    "kinds",
    "load",
    "report",
    "solve",
    "verify",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562) and keep it in the module."""
    if name in _ERRORS:
        from energyopt.spec import errors

        value = getattr(errors, name)
    elif name in _API:
        from energyopt import api

        value = getattr(api, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The ``energyopt`` module's type: ``energyopt.verify`` is the API function,
    though ``energyopt.verify`` is also the subpackage of the verifiers, whose first
    import writes the subpackage over the package's attribute of that name.
    ``from energyopt.verify import ...`` and ``import energyopt.verify.violation`` keep
    working (they read ``sys.modules``); ``import energyopt.verify.x as y`` does not,
    since it reads the attribute."""

    @property
    def verify(self) -> Any:
        from energyopt.api import verify

        return verify

    @verify.setter
    def verify(self, value: Any) -> None:
        """The import system binding the subpackage: it stays in ``sys.modules``."""


sys.modules[__name__].__class__ = _Package
