"""The agent's request protocol: versioned JSON, one message per line, with a size cap.

A request is one JSON object on one line (UTF-8, ending in ``\\n``)::

    {"v": 1, "id": 7, "op": "set_clock", "args": {"gpu": "node0/1", "clock_mhz": 1410}}

and its answer is one line as well, either ``{"v": 1, "id": 7, "ok": true, "result": {...}}``
or ``{"v": 1, "id": 7, "ok": false, "error": {"code": "outside_envelope", "reason": "..."}}``.
A line longer than ``MAX_MESSAGE_BYTES`` is refused (code ``oversized``) and the
connection closed, since the rest of it cannot be told from the next request.
docs/agent.md lists every operation, its arguments and every error code.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from energyopt.control import Refused as Refused  # the checks raise it too

PROTOCOL_VERSION = 1
"""The version this agent and client speak; a request with another ``v`` is refused."""

MAX_MESSAGE_BYTES = 1 << 20
"""Largest request or answer line (bytes, newline included): a plan of a whole node fits."""

OPERATIONS = (
    "status",
    "heartbeat",
    "apply",
    "set_clock",
    "set_power_limit",
    "shift_mps",
    "measure",
    "restore",
)
"""Every operation, in the order docs/agent.md describes them."""

ERROR_CODES = (
    "bad_request",  # not JSON, not an object, a missing or mistyped field
    "oversized",  # a line over MAX_MESSAGE_BYTES
    "unsupported_version",  # "v" other than PROTOCOL_VERSION
    "unknown_op",  # an operation not in OPERATIONS
    "unauthorized",  # the peer's uid/gid may not run this operation (policy)
    "outside_policy",  # a GPU, clock or power limit the operator's policy does not allow
    "outside_envelope",  # a clock or power limit outside the envelope of the plan in force
    "no_plan",  # an online change with no plan in force
    "bad_plan",  # a plan that does not fit this host (GPU types, clocks, MIG layout)
    "not_supported",  # a clock or power limit the device itself does not accept
    "device_error",  # NVML refused or failed; the apply was rolled back
    "internal",  # a bug in the agent; the message says what
)




class MessageTooLarge(Exception):
    """A line longer than the cap arrived; the connection cannot be resynchronised."""


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line (compact JSON, UTF-8, newline); Refused if over the cap."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise Refused(
            "oversized", f"message of {len(data)} bytes is over the cap of {MAX_MESSAGE_BYTES}"
        )
    return data


class LineReader:
    """Reads newline-terminated messages from a socket, never buffering more than the cap."""

    def __init__(self, sock: socket.socket, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.sock = sock
        self.limit = limit
        self.buf = bytearray()

    def read_line(self) -> bytes | None:
        """The next line without its newline; None at end of stream (a partial line is
        dropped); MessageTooLarge when more than ``limit`` bytes come without a newline."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                if end + 1 > self.limit:
                    raise MessageTooLarge
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return line
            if len(self.buf) >= self.limit:
                raise MessageTooLarge
            chunk = self.sock.recv(min(65536, self.limit + 1 - len(self.buf)))
            if not chunk:
                return None
            self.buf.extend(chunk)


def decode_request(line: bytes) -> tuple[Any, str, dict[str, Any]]:
    """(id, op, args) of a request line; Refused with the field that is wrong."""
    try:
        msg = json.loads(line.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused("bad_request", f"not a JSON line: {exc}") from None
    if not isinstance(msg, dict):
        raise Refused("bad_request", f"a request is a JSON object, got {type(msg).__name__}")
    rid = msg.get("id")
    version = msg.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise Refused(
            "unsupported_version",
            f"v: this agent speaks protocol version {PROTOCOL_VERSION}, the request says "
            f"{version!r}",
        )
    op = msg.get("op")
    if not isinstance(op, str):
        raise Refused("bad_request", "op: missing or not a string")
    if op not in OPERATIONS:
        raise Refused("unknown_op", f"op: {op!r} is not one of {', '.join(OPERATIONS)}")
    args = msg.get("args", {})
    if not isinstance(args, dict):
        raise Refused("bad_request", f"args: expected an object, got {type(args).__name__}")
    unknown = set(msg) - {"v", "id", "op", "args"}
    if unknown:
        raise Refused("bad_request", f"unknown field(s): {', '.join(sorted(unknown))}")
    return rid, op, args


def answer(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    """A successful answer."""
    return {"v": PROTOCOL_VERSION, "id": rid, "ok": True, "result": result}


def refusal(rid: Any, code: str, reason: str) -> dict[str, Any]:
    """A refusal with its code and reason."""
    error = {"code": code, "reason": reason}
    return {"v": PROTOCOL_VERSION, "id": rid, "ok": False, "error": error}
