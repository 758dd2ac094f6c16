"""The one way serving reaches a Dask distributed cluster (the table compiler's
cells and column generation's pricing): the ``distributed`` module, or a SpecError
that says how to install it, and a client to a scheduler address."""

from __future__ import annotations

import importlib
from typing import Any

from energyopt.spec.errors import SpecError

DASK_CONNECT_TIMEOUT_S = 30.0
"""How long to try reaching a Dask scheduler before giving up, seconds."""


def distributed() -> Any:
    """The ``distributed`` module (partly typed: used as Any); SpecError without it."""
    try:
        return importlib.import_module("distributed")
    except ImportError:
        raise SpecError(
            ["--scheduler needs dask.distributed: pip install 'energyopt[dask]'"]
        ) from None


def connect(scheduler: Any, timeout_s: float) -> Any:
    """A ``distributed.Client`` to ``scheduler`` (an address or a cluster), trying for
    ``timeout_s`` seconds; SpecError naming the address when it cannot connect."""
    dist = distributed()
    try:
        return dist.Client(scheduler, timeout=f"{timeout_s}s")
    except OSError as exc:
        raise SpecError([f"--scheduler {scheduler}: cannot connect: {exc}"]) from None
