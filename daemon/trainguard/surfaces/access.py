"""Who may read the metrics port, from the web config (config/web.py): the TLS context, the client
certificate's names, the basic-auth users, and the headers every answer carries.

Basic auth works as exporter-toolkit's: a user and password are checked with bcrypt (the `bcrypt`
package, loaded only when users are configured), an unknown user costs the same bcrypt against a fixed
hash so timing does not tell which users exist, and the outcome is cached, so a kept scrape costs a
SHA-256 rather than a bcrypt (~50 ms at cost 10). The cache is keyed by a salted hash, never the password.

Verified credentials and refused ones are cached apart: a flood of wrong passwords fills and empties only
the refused ones, so Prometheus' credential stays verified. One bcrypt runs at a time (each is a core for
~50 ms); a check that cannot start one within BCRYPT_WAIT is BUSY (answered 503), never queued without end.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import os
import ssl
import threading
from enum import Enum

from trainguard.config.web import WebConfig, server_context

# bcrypt of "fakepassword" (exporter-toolkit's): an unknown user's password is checked against it.
UNKNOWN_USER_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
CACHE_SIZE = 100
BCRYPT_WAIT = 0.5  # seconds a check waits for the bcrypt in progress before it answers BUSY


class Verdict(Enum):
    ALLOWED = "allowed"
    REFUSED = "refused"
    BUSY = "busy"  # the password could not be checked in time: try again


class Access:
    def __init__(self, web: WebConfig | None = None):
        web = web or WebConfig()
        self.context: ssl.SSLContext | None = server_context(web.tls_server_config)
        self.headers = list(web.http_server_config.headers.items())
        sans = web.tls_server_config.client_allowed_sans
        self.sans = None if sans is None else {_san(s) for s in sans}
        self.users = {user: hashed.encode() for user, hashed in web.basic_auth_users.items()}
        self._salt = os.urandom(16)
        self._verified: set[bytes] = set()
        self._refused: set[bytes] = set()
        self._lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # one bcrypt at a time: each is ~50 ms of a core

    def check(self, authorization: str | None) -> Verdict:
        """Whether a request with this Authorization header may be answered."""
        if not self.users:
            return Verdict.ALLOWED
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return Verdict.REFUSED
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Verdict.REFUSED
        if not sep:
            return Verdict.REFUSED
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((self._salt, user.encode(), hashed or b"", password.encode()))).digest()
        with self._lock:
            if key in self._verified:
                return Verdict.ALLOWED
            if key in self._refused:
                return Verdict.REFUSED
        if not self._bcrypt_lock.acquire(timeout=BCRYPT_WAIT):
            return Verdict.BUSY
        try:
            import bcrypt

            ok = bcrypt.checkpw(password.encode(), hashed or UNKNOWN_USER_HASH) and hashed is not None
        finally:
            self._bcrypt_lock.release()
        with self._lock:
            cache = self._verified if ok else self._refused
            if len(cache) >= CACHE_SIZE:  # a flood of wrong passwords empties only the refused ones
                cache.clear()
            cache.add(key)
        return Verdict.ALLOWED if ok else Verdict.REFUSED

    def peer_allowed(self, sock: ssl.SSLSocket) -> bool:
        """With client_allowed_sans: the verified client certificate names one of them."""
        if self.sans is None:
            return True
        cert = sock.getpeercert() or {}
        return any(_san(value) in self.sans for _kind, value in cert.get("subjectAltName", ()))


def _san(value: str) -> str:
    """A SAN as compared: IP addresses in one form (Python writes IPv6 ones in full, Go compressed)."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value
