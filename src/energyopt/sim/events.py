"""The event queue every simulator runs on: timed events, popped in time order.

The fleet simulator (``sim.engine``), the keep-alive simulator
(``families.keepalive.sim``) and the serverless simulator
(``families.serverless.sim``) each push their own kinds of event onto one of
these and dispatch what they pop. Ties in time are broken by ``rank`` (lower
first; a simulator uses it to say, for example, that a container that finishes
at time t frees its memory before a request arriving at t is placed), then by
the order of the pushes, so a run is the same on every machine and never
compares two events' payloads. Times are in seconds of simulated time.
"""

from __future__ import annotations

import heapq
import math
from typing import Generic, TypeVar

E = TypeVar("E")


class EventQueue(Generic[E]):
    """A priority queue of ``(time s, rank, push order, event)``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, E]] = []
        self._seq = 0

    def push(self, t: float, event: E, rank: int = 0) -> None:
        """Schedule ``event`` at ``t`` (s); among events at one time, lower ``rank``
        first, then the one pushed first."""
        self._seq += 1
        heapq.heappush(self._heap, (t, rank, self._seq, event))

    def pop(self) -> tuple[float, E]:
        """The next event and its time (s); ``IndexError`` when the queue is empty."""
        t, _, _, event = heapq.heappop(self._heap)
        return t, event

    def next_time(self) -> float:
        """The time (s) of the next event, ``inf`` when there is none."""
        return self._heap[0][0] if self._heap else math.inf

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
