"""Column generation's pricing on a Dask distributed cluster.

Each round of column generation (``colgen.generate_columns``) solves one pricing
problem per (class, clock): listed configurations priced in one pass, or a
knapsack. ``DaskPricer`` sends them to Dask workers: the pricing data (operating
points, objective coefficients, classes, knapsack items: ``colgen.PricingData``)
goes to every worker once (``scatter``, broadcast), and each round only its duals
and the problems, in batches of about equal size, one or more per worker. The
answers come back in the order of the problems and join the program in that
order, so the columns, the LP, the plan and the bound are those of the serial run
(``tests/test_serving_dask.py`` checks it on a LocalCluster of two processes).

``scheduler`` is what the table compiler's ``--scheduler`` takes: the address of
a running scheduler (``tcp://host:8786``; start one with ``dask scheduler`` and
its workers with ``dask worker tcp://host:8786`` on each machine, each with
energyopt installed), or ``local:N`` for a LocalCluster of N worker processes on
this machine (one thread each). ``energyopt solve FILE --scheduler ADDRESS``
and ``solve(..., scheduler=ADDRESS)`` run a serving solve's column generation
this way; every other step stays in the calling process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any

from energyopt.families.serving.dask_client import DASK_CONNECT_TIMEOUT_S, connect, distributed
from energyopt.families.serving.formulations.columns import Duals
from energyopt.families.serving.solvers.colgen import (
    Priced,
    PricingData,
    PricingTask,
    price_batch,
    using_pricer,
)
from energyopt.spec.errors import SpecError

BATCHES_PER_WORKER = 2
"""Batches of pricing problems per worker and round (fewer messages than one per
problem; more than one evens out problems of unequal cost)."""
LOCAL_PREFIX = "local:"
MIN_ITEMS = 20_000
"""Below this many pricing items in all (knapsack items plus listed configurations'
ops), a round is priced in the calling process: its problems take milliseconds,
less than a round trip to the workers (the quickstart's branch-and-price, a few
hundred tiny rounds, ran into its 60-s limit on Dask and converged in 20 s
without). The answers are the same either way."""


def local_workers(scheduler: str) -> int | None:
    """N of a ``local:N`` scheduler (N >= 1), None for an address; SpecError for a
    ``local:`` without a positive whole number."""
    if not scheduler.startswith(LOCAL_PREFIX):
        return None
    text = scheduler[len(LOCAL_PREFIX) :]
    if not text.isdigit() or int(text) < 1:
        raise SpecError(
            [f"--scheduler {scheduler}: local:N needs N, the number of worker processes, >= 1"]
        )
    return int(text)


def _items(data: PricingData) -> int:
    """Pricing items of ``data``: knapsack items and listed configurations' ops."""
    return sum(len(ks) for ks in data.knapsacks.values()) + sum(
        len(cs.flat) for cs in data.configs.values()
    )


def _shipped(data: PricingData) -> PricingData:
    """``data`` as the workers get it: a class of several GPUs with its first GPU
    only, its state dropped (pricing reads a class's GPUs only for the state of a
    class of one GPU, which is shipped whole)."""
    classes = [
        c if c.size == 1 else replace(c, gpus=(c.gpus[0].model_copy(update={"state": None}),))
        for c in data.classes
    ]
    return replace(data, classes=classes)


class DaskPricer:
    """A ``colgen.Pricer`` whose pricing problems run on Dask workers (see the
    module docstring). Use it as a context manager: leaving it closes the client
    and a LocalCluster it started."""

    def __init__(self, scheduler: str, *, min_items: int = MIN_ITEMS) -> None:
        dist = distributed()
        self.scheduler = scheduler
        self.min_items = min_items
        self._cluster: Any = None
        n_local = local_workers(scheduler)
        try:
            if n_local is not None:
                self._cluster = dist.LocalCluster(
                    n_workers=n_local,
                    threads_per_worker=1,
                    processes=True,
                    # None does not turn the dashboard off (it binds :8787 and warns
                    # where that port is taken: dask/distributed#8136); ":0" takes a
                    # free port, so two pricers or a user's own cluster never clash
                    dashboard_address=":0",
                    memory_limit=0,
                )
                self.client: Any = dist.Client(self._cluster)
            else:
                self.client = connect(scheduler, DASK_CONNECT_TIMEOUT_S)
        except OSError as exc:
            self.close()
            raise SpecError([f"--scheduler {scheduler}: cannot connect: {exc}"]) from None
        self._data: PricingData | None = None
        self._data_future: Any = None

    def workers(self) -> int:
        """Workers the scheduler knows now (at least 1)."""
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def price(
        self,
        data: PricingData,
        tasks: list[PricingTask],
        duals: Duals,
        effort: int,
        tol: float,
        build: bool,
    ) -> list[Priced]:
        """Answers to ``tasks``, in their order, from the workers (in this process
        when ``data`` has fewer than ``min_items`` items)."""
        if not tasks:
            return []
        if _items(data) < self.min_items:
            return price_batch(data, tasks, duals, effort, tol, build)
        if self._data is not data:
            self._data_future = self.client.scatter(_shipped(data), broadcast=True, hash=False)
            self._data = data
        n = min(len(tasks), BATCHES_PER_WORKER * self.workers())
        batches = [list(range(i, len(tasks), n)) for i in range(n)]
        futures = [
            self.client.submit(
                price_batch,
                self._data_future,
                [tasks[i] for i in batch],
                duals,
                effort,
                tol,
                build,
                pure=False,
            )
            for batch in batches
        ]
        answers: list[Priced | None] = [None] * len(tasks)
        for batch, result in zip(batches, self.client.gather(futures), strict=True):
            for i, answer in zip(batch, result, strict=True):
                answers[i] = answer
        out = [a for a in answers if a is not None]
        assert len(out) == len(tasks)
        return out

    def close(self) -> None:
        """Close the client and the LocalCluster this pricer started, if any."""
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> DaskPricer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def pricing_on(scheduler: str | None) -> Iterator[DaskPricer | None]:
    """Inside the block, column generation prices on the Dask cluster at
    ``scheduler`` (``local:N`` or an address); nothing changes when None."""
    if scheduler is None:
        yield None
        return
    with DaskPricer(scheduler) as pricer, using_pricer(pricer):
        yield pricer
