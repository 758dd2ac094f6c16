"""The ``agent`` verb: run the node agent until SIGTERM or SIGINT (docs/agent.md)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from energyopt.cli.common import EXIT_OK
from energyopt.cli.executor import nvml_catalog, nvml_errors
from energyopt.spec.errors import SpecError

DEFAULT_STATE_DIR = "/var/lib/energyopt/agent"


def _metrics_address(text: str, option: str = "--metrics") -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:9400``; ``[::1]:9400``) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise SpecError([f"{option} {text!r}: expected HOST:PORT, for example 127.0.0.1:9400"])
    return host.strip("[]"), int(port)


def _say(line: str) -> None:
    print(line, flush=True)


@nvml_errors
def cmd_agent(args: argparse.Namespace) -> int:
    from energyopt.agent.policy import group_id, load_policy
    from energyopt.agent.server import AgentServer, TlsAgentServer
    from energyopt.agent.service import Agent
    from energyopt.agent.state import StateDir
    from energyopt.agent.watchdog import Watchdog
    from energyopt.nvml.session import open_session

    policy = load_policy(args.policy)
    catalog = nvml_catalog(args.catalog)
    metrics_at = _metrics_address(args.metrics) if args.metrics else None
    if args.heartbeat_timeout is not None and not args.heartbeat_timeout > 0:
        raise SpecError(["--heartbeat-timeout: expected a positive number of seconds"])
    try:
        mode = int(args.socket_mode, 8)
    except ValueError:
        raise SpecError([f"--socket-mode {args.socket_mode!r}: expected octal, e.g. 660"]) from None
    group = group_id(args.socket_group) if args.socket_group else None
    tls_files = (args.tls_cert, args.tls_key, args.tls_client_ca)
    tcp_at = _metrics_address(args.tcp, "--tcp") if args.tcp else None
    if (tcp_at is None) != (not any(tls_files)) or (tcp_at and not all(tls_files)):
        raise SpecError(
            ["--tcp: needs --tls-cert, --tls-key and --tls-client-ca (mutual TLS), and they "
             "are for --tcp only"]
        )
    tls_context = None
    if tcp_at is not None:
        from energyopt.agent.tls import server_context

        tls_context = server_context(*tls_files)
    state_dir = args.state_dir or os.environ.get("STATE_DIRECTORY") or DEFAULT_STATE_DIR
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    with open_session() as session:
        _say(f"energyopt agent: {session.where or session.ctx.nvml.kind}")
        agent = Agent(
            session,
            policy,
            StateDir(state_dir),
            catalog,
            mps_dir=args.mps_dir,
            restore_on_stop=not args.keep_on_stop,
            heartbeat_timeout_s=args.heartbeat_timeout,
            say=_say,
        )
        agent.start()
        server = AgentServer(agent, args.socket, mode=mode, group=group)
        server.start()
        watchdog = Watchdog(agent, args.heartbeat_timeout) if args.heartbeat_timeout else None
        metrics = None
        tcp = None
        try:
            if tcp_at is not None and tls_context is not None:
                tcp = TlsAgentServer(agent, *tcp_at, tls_context)
                tcp.start()
                _say(f"listening on TCP {tcp_at[0]}:{tcp.port} (mutual TLS)")
            if watchdog is not None:
                watchdog.start()
            if metrics_at is not None:
                from energyopt.agent.metrics import MetricsServer

                metrics = MetricsServer(agent, *metrics_at)
                _say(f"metrics on http://{metrics_at[0]}:{metrics.port}/metrics")
            old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            _say(f"listening on {args.socket} (state in {state_dir})")
            while not stop.wait(0.5):
                pass
            for s, h in old.items():
                signal.signal(s, h)
        finally:
            if metrics is not None:
                metrics.stop()
            if watchdog is not None:
                watchdog.stop()
            if tcp is not None:
                tcp.stop()
            server.stop()
            agent.stop()
    _say("energyopt agent: stopped")
    return EXIT_OK


def configure(sub: Any) -> None:
    """Add the ``agent`` verb to the ``energyopt`` subcommands."""
    p = sub.add_parser(
        "agent",
        help="run the node agent: applies plans and online clock changes within a policy",
    )
    p.add_argument("--policy", required=True, help="policy file (YAML/JSON/TOML; docs/agent.md)")
    p.add_argument("--socket", required=True, help="Unix socket path to listen on")
    p.add_argument(
        "--state-dir",
        help=f"checkpoints and the plan in force ($STATE_DIRECTORY, else {DEFAULT_STATE_DIR})",
    )
    p.add_argument("--socket-mode", default="660", help="socket permissions, octal (660)")
    p.add_argument("--socket-group", help="group owning the socket (name or gid)")
    p.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics (e.g. 127.0.0.1:9400)"
    )
    p.add_argument(
        "--tcp", metavar="HOST:PORT", help="also listen on TCP, mutual TLS only (remote controller)"
    )
    p.add_argument("--tls-cert", metavar="FILE", help="the agent's certificate (PEM), for --tcp")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM), for --tcp")
    p.add_argument(
        "--tls-client-ca", metavar="FILE", help="CA that signs client certificates, for --tcp"
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        metavar="S",
        help="return GPUs to the plan's settings when the controller is quiet this long (s)",
    )
    p.add_argument(
        "--keep-on-stop",
        action="store_true",
        help="leave the plan in place on stop (default: restore the original settings)",
    )
    p.add_argument(
        "--mps-dir", default="/tmp/energyopt-mps", help="base of the per-GPU MPS directories"
    )
    p.add_argument("--catalog", action="append", default=[], metavar="FILE")
    p.set_defaults(func=cmd_agent)
