"""TLS contexts for the agent's optional TCP listener: mutual TLS, both sides checked.

The agent presents its certificate and requires a client certificate signed by the
client CA it is given; the policy's ``tls_clients`` name the clients (the common name
of the certificate's subject) each operation is open to. TLS 1.2 at least.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from energyopt.spec.errors import SpecError


def _load(what: str, fn: Callable[..., object], *files: str) -> None:
    try:
        fn(*files)
    except (OSError, ssl.SSLError) as exc:
        raise SpecError([f"{files[0]}: {what}: cannot load: {exc}"]) from None


def server_context(cert: str | Path, key: str | Path, client_ca: str | Path) -> ssl.SSLContext:
    """The agent's side: its certificate and key, and the CA that signs client certificates."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load("--tls-cert/--tls-key", ctx.load_cert_chain, str(cert), str(key))
    _load("--tls-client-ca", ctx.load_verify_locations, str(client_ca))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cert: str | Path, key: str | Path, server_ca: str | Path) -> ssl.SSLContext:
    """A controller's side: its certificate and key, and the CA that signs the agent's."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load("client certificate", ctx.load_cert_chain, str(cert), str(key))
    _load("server CA", ctx.load_verify_locations, str(server_ca))
    return ctx


def peer_name(conn: ssl.SSLSocket) -> str | None:
    """The common name of the verified client certificate's subject (None without one)."""
    cert = conn.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject", ())
    for rdn in subject if isinstance(subject, tuple) else ():
        for pair in rdn:
            if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == "commonName":
                return str(pair[1])
    return None
