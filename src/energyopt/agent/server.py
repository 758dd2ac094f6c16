"""The agent's Unix-domain-socket server: who is calling (SO_PEERCRED), framing, dispatch.

One thread accepts; each connection has its own thread that reads a request line,
checks the peer against the policy, hands the operation to the ``Agent`` and writes
the answer line. A connection quiet for ``idle_timeout_s`` is closed. ``stop`` closes
the listening socket and every open connection and joins their threads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import stat
import struct
import threading
from pathlib import Path
from typing import Any

from energyopt.agent.policy import PeerCred, peer_groups
from energyopt.agent.protocol import (
    LineReader,
    MessageTooLarge,
    Refused,
    answer,
    decode_request,
    encode,
    refusal,
)
from energyopt.agent.service import Agent
from energyopt.agent.tls import peer_name
from energyopt.spec.errors import SpecError

_ACCEPT_POLL_S = 0.2
"""How often the accept loop looks whether the server is stopping (s)."""


def peer_cred(conn: socket.socket) -> PeerCred:
    """pid, uid and groups of the process at the other end of a Unix socket."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid, uid, peer_groups(uid, gid))


def _claim_path(path: Path) -> None:
    """Remove a stale socket at ``path``; refuse when an agent answers there or the path
    is something other than a socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SpecError([f"{path}: --socket: exists and is not a socket; give another path"])
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        os.unlink(path)  # nobody listens: left over from an agent that died
        return
    finally:
        probe.close()
    raise SpecError([f"{path}: --socket: another agent is listening there"])


class AgentServer:
    """Serves ``agent`` on the Unix socket ``path`` (mode ``mode``, group ``group``)."""

    def __init__(
        self,
        agent: Agent,
        path: str | Path,
        *,
        mode: int = 0o660,
        group: int | None = None,
        idle_timeout_s: float = 300.0,
    ) -> None:
        self.agent = agent
        self.path = Path(path)
        self.mode = mode
        self.group = group
        self.idle_timeout_s = idle_timeout_s
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._conns: set[socket.socket] = set()
        self._guard = threading.Lock()
        self._accept_thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind, listen, and accept in a thread."""
        listener = self._bind()
        listener.listen(64)
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="agent-accept", daemon=True
        )
        self._accept_thread.start()

    def _bind(self) -> socket.socket:
        """The Unix socket, never reachable by others before its mode is set (it is bound
        with a umask that shuts everyone else out)."""
        _claim_path(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        except OSError as exc:
            listener.close()
            raise SpecError(
                [f"{self.path}: --socket: cannot listen: {exc.strerror or exc}"]
            ) from None
        finally:
            os.umask(old)
        try:
            if self.group is not None:
                os.chown(self.path, -1, self.group)
            os.chmod(self.path, self.mode)
        except OSError as exc:
            listener.close()
            os.unlink(self.path)
            raise SpecError(
                [f"{self.path}: --socket-group/--socket-mode: {exc.strerror or exc}"]
            ) from None
        return listener

    def _open(self, conn: socket.socket) -> tuple[socket.socket, PeerCred]:
        """The connection to talk on and who is at its other end."""
        return conn, peer_cred(conn)

    def _cleanup(self) -> None:
        """Remove the socket file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="agent-conn", daemon=True
            )
            with self._guard:
                if self._stopping.is_set():
                    conn.close()
                    break
                self._conns.add(conn)
                self._threads.add(thread)
            thread.start()

    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            data = encode(message)
        except Refused as exc:  # an answer over the cap
            data = encode(refusal(message.get("id"), exc.code, exc.reason))
        conn.sendall(data)

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.idle_timeout_s)
            try:
                opened, peer = self._open(conn)
            except (ssl.SSLError, Refused) as exc:
                self.agent.refused("?", "unauthorized")
                self.agent.say(f"connection refused: {exc}")
                return
            with self._guard:
                self._conns.discard(conn)
                self._conns.add(opened)
            conn = opened
            reader = LineReader(conn)
            while not self._stopping.is_set():
                try:
                    line = reader.read_line()
                except MessageTooLarge:
                    self.agent.refused("?", "oversized")
                    self._send(
                        conn,
                        refusal(None, "oversized", "a request line is over the cap of "
                                f"{reader.limit} bytes; the connection is closed"),
                    )
                    return
                if line is None:
                    return
                if not line.strip():
                    continue
                self._send(conn, self._dispatch(line, peer))
        except OSError:
            return  # the peer went away, timed out, or the server is stopping
        finally:
            with self._guard:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(OSError):
                conn.close()

    def _dispatch(self, line: bytes, peer: PeerCred) -> dict[str, Any]:
        rid: Any = None
        op = "?"
        try:
            rid, op, args = decode_request(line)
            self.agent.policy.authorize(op, peer)
        except Refused as exc:
            self.agent.refused(op, exc.code)
            return refusal(rid, exc.code, exc.reason)
        try:
            return answer(rid, self.agent.handle(op, args))
        except Refused as exc:
            return refusal(rid, exc.code, exc.reason)
        except Exception as exc:  # a bug: answer it rather than drop the connection
            self.agent.refused(op, "internal")
            return refusal(rid, "internal", f"{type(exc).__name__}: {exc}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection, join the threads, remove the socket."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout_s)
        with self._guard:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout_s)
        if self._listener is not None:
            self._cleanup()
        self._listener = None


class TlsAgentServer(AgentServer):
    """Serves ``agent`` on TCP ``host:port`` with mutual TLS (``context`` from
    ``energyopt.agent.tls.server_context``); the policy's ``tls_clients`` name who may do
    what. Port 0 takes any free port (``port`` says which)."""

    def __init__(
        self,
        agent: Agent,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        idle_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(agent, f"{host}:{port}", idle_timeout_s=idle_timeout_s)
        self.host = host
        self.port = port
        self.context = context

    def _bind(self) -> socket.socket:
        try:
            info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
            listener = socket.socket(info[0], socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(info[4])
        except OSError as exc:
            raise SpecError(
                [f"--tcp {self.host}:{self.port}: cannot listen: {exc.strerror or exc}"]
            ) from None
        self.port = int(listener.getsockname()[1])
        return listener

    def _open(self, conn: socket.socket) -> tuple[socket.socket, PeerCred]:
        tls = self.context.wrap_socket(conn, server_side=True)
        name = peer_name(tls)
        if name is None:
            tls.close()
            raise Refused("unauthorized", "the client certificate names no common name")
        return tls, PeerCred(None, None, (), name)

    def _cleanup(self) -> None:
        """Nothing to remove for TCP."""
