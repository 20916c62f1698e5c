"""A real SMTP server on 127.0.0.1 (aiosmtpd) that records what it accepted.

Plain, or STARTTLS with a throw-away self-signed certificate (made with the openssl
command) and LOGIN/PLAIN authentication that checks one user and password.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ReceivedMail:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    tls: bool  # the session was upgraded with STARTTLS before DATA
    login: str | None  # the user that authenticated, if any

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def body(self) -> str:
        part = self.message.get_body(preferencelist=("plain", "html"))
        return part.get_content() if part is not None else ""


def openssl_reason() -> str | None:
    return None if shutil.which("openssl") else "the openssl command is needed to make a test certificate"


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-days", "1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpServer:
    def __init__(self, *, starttls_cert: tuple[Path, Path] | None = None, user: str = "", password: str = ""):
        self.starttls_cert = starttls_cert
        self.user, self.password = user, password
        self.port = free_port()
        self._mails: list[ReceivedMail] = []
        self._cond = threading.Condition()
        self._controller = None

    def __enter__(self) -> "SmtpServer":
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        server = self

        class Handler:
            async def handle_DATA(self, smtp, session, envelope):
                login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
                mail = ReceivedMail(envelope.mail_from, tuple(envelope.rcpt_tos),
                                    message_from_bytes(envelope.content, policy=policy.default),
                                    tls=session.ssl is not None, login=login)
                with server._cond:
                    server._mails.append(mail)
                    server._cond.notify_all()
                return "250 OK"

        def authenticate(smtp, session, envelope, mechanism, auth_data):
            ok = (isinstance(auth_data, LoginPassword) and auth_data.login.decode() == self.user
                  and auth_data.password.decode() == self.password)
            return AuthResult(success=ok, auth_data=auth_data if ok else None)

        kwargs = {}
        if self.starttls_cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*map(str, self.starttls_cert))
            kwargs = {"tls_context": context, "require_starttls": True}
        if self.user:
            kwargs.update(authenticator=authenticate, auth_require_tls=bool(self.starttls_cert))
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, **kwargs)
        self._controller.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._controller is not None:
            self._controller.stop()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[ReceivedMail]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._mails) >= count, timeout):
                raise TimeoutError(f"{len(self._mails)} of {count} mails arrived within {timeout}s")
            return list(self._mails)
