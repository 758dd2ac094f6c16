"""The heartbeat watchdog: when the controller goes quiet, the GPUs return to the plan.

The watchdog is armed by the first heartbeat (any ``heartbeat``, ``apply``,
``set_clock`` or ``set_power_limit`` request). When none arrives for
``timeout_s`` seconds, every online change (a boost, a lowered clock, a changed
power limit) is put back to the plan in force's setting, once; the next
heartbeat arms it again.
"""

from __future__ import annotations

import threading
import time

from energyopt.agent.service import Agent


class Watchdog:
    """Checks ``agent``'s heartbeat every ``min(timeout_s / 4, 0.5)`` seconds."""

    def __init__(self, agent: Agent, timeout_s: float) -> None:
        self.agent = agent
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-watchdog", daemon=True)

    def start(self) -> None:
        """Start checking."""
        self._thread.start()

    def _run(self) -> None:
        period = min(self.timeout_s / 4, 0.5)
        while not self._stop.wait(period):
            last = self.agent.last_heartbeat
            if last is None or self.agent.watchdog_fired:
                continue
            if time.monotonic() - last > self.timeout_s:
                self.agent.fallback()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop checking and join the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
