"""A Python client of the node agent (one connection, thread-safe, blocking).

::

    with AgentClient("/run/energyopt/agent.sock") as agent:
        agent.apply(plan)                      # a Plan, its JSON data, or a plan file
        agent.set_clock("node0/1", 1410)       # a boost, within the plan's envelope
        agent.set_clock("node0/1", 1110)       # back to the plan's clock
        agent.heartbeat()
        print(agent.status()["gpus"])

A refusal raises ``Refused`` with the agent's ``code`` and ``reason``. The client is
the online control's ``GpuControl`` in production (``energyopt.control``):
``GlobalScheduler(..., control=AgentClient(path))`` sends its boosts, restores, trims
and share shifts to the agent.
"""

from __future__ import annotations

import itertools
import json
import socket
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from energyopt.agent.protocol import (
    PROTOCOL_VERSION,
    LineReader,
    MessageTooLarge,
    Refused,
    encode,
)
from energyopt.spec.io import read_data
from energyopt.spec.plan import Plan


class AgentUnavailable(Exception):
    """The agent's socket cannot be reached, or it closed the connection."""


class AgentClient:
    """Talks to the agent listening on the Unix socket ``path``, or on TCP ``(host, port)``
    with mutual TLS (``ssl_context`` from ``energyopt.agent.tls.client_context``);
    ``timeout_s`` bounds every connect, send and answer (seconds)."""

    def __init__(
        self,
        path: str | Path | tuple[str, int],
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = path
        self.path = f"{path[0]}:{path[1]}" if isinstance(path, tuple) else str(path)
        if isinstance(path, tuple) and ssl_context is None:
            raise ValueError("the agent's TCP listener takes mutual TLS only: give ssl_context")
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._reader: LineReader | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        if self._sock is not None:
            self._sock.close()
        self._sock, self._reader = None, None

    def _connect(self) -> tuple[socket.socket, LineReader]:
        if self._sock is None or self._reader is None:
            address = self.address
            sock: socket.socket
            try:
                if isinstance(address, tuple):
                    sock = socket.create_connection(address, timeout=self.timeout_s)
                    assert self.ssl_context is not None
                    sock = self.ssl_context.wrap_socket(sock, server_hostname=address[0])
                else:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(self.timeout_s)
                    try:
                        sock.connect(str(address))
                    except OSError:
                        sock.close()
                        raise
            except OSError as exc:  # ssl.SSLError is one
                raise AgentUnavailable(f"{self.path}: cannot reach the agent: {exc}") from None
            self._sock, self._reader = sock, LineReader(sock)
        return self._sock, self._reader

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its result; Refused when the agent refuses it."""
        with self._lock:
            rid = next(self._ids)
            data = encode({"v": PROTOCOL_VERSION, "id": rid, "op": op, "args": args})
            sock, reader = self._connect()
            try:
                sock.sendall(data)
                line = reader.read_line()
            except (OSError, MessageTooLarge) as exc:
                self.close()
                raise AgentUnavailable(f"{self.path}: {op}: {exc}") from None
            if line is None:
                self.close()
                raise AgentUnavailable(f"{self.path}: {op}: the agent closed the connection")
        msg = json.loads(line)
        if not msg.get("ok"):
            error = msg.get("error", {})
            raise Refused(str(error.get("code")), str(error.get("reason")))
        result: dict[str, Any] = msg["result"]
        return result

    def status(self) -> dict[str, Any]:
        """Readings, plan settings, envelope and online changes of every GPU."""
        return self.call("status")

    def heartbeat(self) -> dict[str, Any]:
        """Tell the agent's watchdog the controller is alive."""
        return self.call("heartbeat")

    def apply(
        self,
        plan: Plan | dict[str, Any] | str | Path,
        device_map: dict[str, str | int] | None = None,
        envelope: dict[str, dict[str, list[float]]] | None = None,
    ) -> dict[str, Any]:
        """Apply a serving plan (a Plan, its JSON data, or a plan file's path) with the
        executor's transaction; ``device_map`` {plan_gpu: index or UUID}; ``envelope``
        {plan_gpu: {"clock_mhz": [lo, hi], "power_limit_w": [lo, hi]}} narrows the
        policy's ranges for the online changes."""
        if isinstance(plan, Plan):
            data = plan.model_dump(mode="json", exclude_none=True)
        elif isinstance(plan, dict):
            data = plan
        else:
            data = read_data(plan)
        args: dict[str, Any] = {"plan": data}
        if device_map is not None:
            args["map"] = device_map
        if envelope is not None:
            args["envelope"] = envelope
        return self.call("apply", **args)

    def set_clock(self, gpu: str | int, clock_mhz: int) -> dict[str, Any]:
        """Lock a GPU (plan GPU id or NVML index) at ``clock_mhz`` (MHz)."""
        return self.call("set_clock", gpu=gpu, clock_mhz=clock_mhz)

    def set_power_limit(self, gpu: str | int, limit_w: float) -> dict[str, Any]:
        """Set a GPU's power limit (W)."""
        return self.call("set_power_limit", gpu=gpu, power_limit_w=limit_w)

    def shift_shares(self, gpu: str | int, shares_pct: Mapping[str, int]) -> dict[str, Any]:
        """Shift MPS active-thread percentages (op ``shift_mps``) between the placements of
        one GPU of the plan in force: ``shares_pct`` {``workload`` or ``workload:phase``:
        percent}. The answer's ``client_env`` is each client's MPS environment (MPS fixes
        a client's percentage when it connects)."""
        return self.call("shift_mps", gpu=gpu, shares=dict(shares_pct))

    def measure(self, window_s: float) -> dict[str, Any]:
        """Energy (J) and mean power (W) of every GPU over the next ``window_s`` seconds
        (at most 60; the client's ``timeout_s`` must be longer)."""
        if window_s >= self.timeout_s:
            raise ValueError(
                f"measure: window_s {window_s:g} s is not below the client's timeout_s "
                f"{self.timeout_s:g} s"
            )
        return self.call("measure", window_s=window_s)

    def restore(self) -> dict[str, Any]:
        """Put every GPU back as it was before the first apply."""
        return self.call("restore")
