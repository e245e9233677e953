"""A real SMTP server (aiosmtpd) on loopback for the mail tests, with outages on cue.

``SmtpServer`` keeps its port across ``stop()``/``start()`` so a client
configured once sees the server go away and come back. Options: STARTTLS
(required), implicit TLS, and a login checked against one user/password.
``serving()`` runs one for a ``with`` block (test modules make it a fixture).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    authenticated_as: str | None


@dataclass
class _Handler:
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = BytesParser(policy=default_policy).parsebytes(envelope.original_content)
        login = session.auth_data.login.decode() if session.authenticated else None
        with self.lock:
            self.received.append(
                Received(envelope.mail_from, list(envelope.rcpt_tos), message, login)
            )
        return "250 OK"


class _Authenticator:
    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password

    def __call__(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login.decode() == self.user
            and auth_data.password.decode() == self.password
        )
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SmtpServer:
    """aiosmtpd on 127.0.0.1 storing what it receives."""

    def __init__(
        self,
        *,
        starttls: ssl.SSLContext | None = None,
        implicit_tls: ssl.SSLContext | None = None,
        login: tuple[str, str] | None = None,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self._handler = _Handler()
        self._kwargs: dict[str, Any] = {}
        if starttls is not None:
            self._kwargs.update(tls_context=starttls, require_starttls=True)
        if login is not None:
            self._kwargs.update(
                authenticator=_Authenticator(*login),
                auth_required=True,
                # Without TLS in the test, aiosmtpd would refuse AUTH entirely.
                auth_require_tls=starttls is not None,
            )
        self._implicit = implicit_tls
        self._controller: Controller | None = None

    @property
    def received(self) -> list[Received]:
        with self._handler.lock:
            return list(self._handler.received)

    @property
    def running(self) -> bool:
        return self._controller is not None

    def start(self) -> None:
        """Listen (again) on the same port."""
        controller = Controller(
            self._handler, hostname=self.host, port=self.port,
            ssl_context=self._implicit, server_hostname="localhost", **self._kwargs,
        )
        controller.start()
        self._controller = controller

    def stop(self) -> None:
        """Stop listening: clients get connection refused."""
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """The received messages once there are ``count``; fails the test on timeout."""
        limit = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() > limit:
                raise AssertionError(f"{len(self.received)} message(s) arrived, wanted {count}")
            time.sleep(0.02)
        return self.received


@contextlib.contextmanager
def serving(server: SmtpServer | None = None) -> Iterator[SmtpServer]:
    """The server (default: plain, no TLS or login) running for the block, stopped after.

    Test modules wrap it in a fixture: ``with serving() as server: yield server``.
    """
    server = server or SmtpServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cert:
    """A self-signed certificate for 127.0.0.1 and localhost."""

    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_cert(folder: Path) -> Cert:
    """A self-signed certificate, via ``cryptography`` or the ``openssl`` CLI; skips if neither."""
    folder.mkdir(parents=True, exist_ok=True)
    cert = Cert(folder / "cert.pem", folder / "key.pem")
    try:
        _with_cryptography(cert)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("TLS test needs the cryptography package or the openssl CLI; neither found")
        _with_openssl(cert)
    return cert


def _with_cryptography(cert: Cert) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert.cert.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    cert.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _with_openssl(cert: Cert) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(cert.key), "-out", str(cert.cert)],
        check=True, capture_output=True,
    )
