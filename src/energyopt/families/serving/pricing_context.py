"""Where a serving solve prices column generation: in this process, or on a Dask
cluster (``solvers/dask_pricing.py``), chosen by ``energyopt solve --scheduler``
and ``energyopt.solve(..., scheduler=...)`` alike."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext


def pricing_context(scheduler: str | None) -> AbstractContextManager[object]:
    """Inside the block, column generation prices on the Dask cluster at ``scheduler``
    (``local:N`` or an address; ``solvers.dask_pricing.pricing_on``); a no-op when
    None, which imports nothing of Dask."""
    if scheduler is None:
        return nullcontext()
    from energyopt.families.serving.solvers.dask_pricing import pricing_on

    return pricing_on(scheduler)
