"""The agent's TCP listener on the loopback address: mutual TLS, clients named by their
certificate's common name in the policy. Certificates are made with the openssl
command for each test (skipped where it is missing)."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from energyopt.agent import AgentClient, AgentUnavailable, Refused
from energyopt.agent.server import TlsAgentServer
from energyopt.agent.tls import client_context, server_context
from tests.test_agent import PLAN, TIMEOUT_S, Running, policy_data, run_agent, sock_dir

__all__ = ["run_agent", "sock_dir"]  # fixtures used below

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1",
        "-subj", f"/CN={name}", cwd=folder,
    )  # fmt: skip


def make_cert(folder: Path, ca: str, name: str, cn: str, san: str | None = None) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=folder,
    )  # fmt: skip
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", ext.name,
        cwd=folder,
    )  # fmt: skip


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    folder = tmp_path / "pki"
    folder.mkdir()
    make_ca(folder, "ca")
    make_ca(folder, "rogue-ca")
    make_cert(folder, "ca", "agent", "agent", san="IP:127.0.0.1")
    make_cert(folder, "ca", "controller", "controller")
    make_cert(folder, "ca", "intruder", "intruder")
    make_cert(folder, "rogue-ca", "forged", "controller")
    return folder


def _start_tls_server(r: Running, pki: Path) -> TlsAgentServer:
    """A started mutual-TLS server for ``r``'s agent on a free local port, with the
    agent's certificate and the ``ca`` authority from ``pki``."""
    server = TlsAgentServer(
        r.agent,
        "127.0.0.1",
        0,
        server_context(pki / "agent.pem", pki / "agent.key", pki / "ca.pem"),
        idle_timeout_s=TIMEOUT_S,
    )
    server.start()
    return server


def test_mutual_tls_names_the_client(run_agent: Callable[..., Running], pki: Path) -> None:
    policy = policy_data(
        status={"tls_clients": ["controller", "intruder"]},
        set_clock={"uids": [os.getuid()], "tls_clients": ["controller"]},
    )
    r = run_agent(policy)
    with r.client() as c:
        c.apply(PLAN)
    server = _start_tls_server(r, pki)

    def client(name: str) -> AgentClient:
        ctx = client_context(pki / f"{name}.pem", pki / f"{name}.key", pki / "ca.pem")
        return AgentClient(("127.0.0.1", server.port), TIMEOUT_S, ctx)

    try:
        with client("controller") as c:
            assert c.set_clock("n/1", 1410)["previous"] == [1320, 1320]
            assert c.status()["gpus"][1]["online"] == {"lock_clocks": [1410, 1410]}
        with client("intruder") as c:
            assert c.status()["plan_id"] is not None
            with pytest.raises(Refused) as exc:
                c.set_clock("n/1", 1320)
            assert exc.value.code == "unauthorized"
            assert "TLS client 'intruder'" in exc.value.reason
        # a certificate from another CA, even with an allowed name, gets no answer
        with client("forged") as c, pytest.raises(AgentUnavailable):
            c.status()
    finally:
        server.stop()
    assert r.sim.get_locked_clocks(1) == (1410, 1410)
    assert r.agent.stats.refusals[("?", "unauthorized")] >= 1


def test_tcp_without_a_client_certificate_is_refused(
    run_agent: Callable[..., Running], pki: Path
) -> None:
    r = run_agent(policy_data(status="any"))
    server = _start_tls_server(r, pki)
    try:
        bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        bare.load_verify_locations(pki / "ca.pem")
        with AgentClient(("127.0.0.1", server.port), TIMEOUT_S, bare) as c, pytest.raises(
            AgentUnavailable
        ):
            c.status()
        with pytest.raises(ValueError, match="mutual TLS"):
            AgentClient(("127.0.0.1", server.port), TIMEOUT_S)
    finally:
        server.stop()
    assert r.sim.writes == []
