"""[metrics] web_config: the web configuration file of Prometheus' exporter-toolkit, the one node_exporter
and dcgm-exporter read with --web.config.file. Same keys, same defaults, same meaning: TLS (server
certificate, client certificates, versions, cipher suites), bcrypt basic-auth users, response headers;
relative paths are relative to the file. What Python's ssl module cannot do the same way is refused by name
instead of being ignored: a setting that silently did less would be a hole.
"""

from __future__ import annotations

import os
import re
import ssl
from typing import Any, Literal

from pydantic import field_validator, model_validator

from trainguard.config.base import Strict

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
# The suites Go's crypto/tls offers (tls.CipherSuites(), what exporter-toolkit accepts), by their OpenSSL
# names. TLS 1.3 suites are not configurable in Go either: accepted, and left as they are.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# The only headers exporter-toolkit lets a web config set, with the values it allows (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None}
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}\Z")
# Keys of newer exporter-toolkit versions that this server does not implement, and what to do instead.
UNSUPPORTED = {
    "cert": "put the certificate in a file and give cert_file",
    "key": "put the key in a file and give key_file",
    "client_ca": "put the CA certificates in a file and give client_ca_file",
    "curve_preferences": "Python's ssl module cannot set a list of curves; remove it (OpenSSL's defaults apply)",
    "rate_limit": "remove it; [metrics] max_connections and the request deadlines bound the load",
}
VERIFYING = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}


def _refuse_unsupported(data: Any) -> Any:
    if isinstance(data, dict):
        for key, instead in UNSUPPORTED.items():
            if key in data:
                raise ValueError(f"{key}: not supported by trainguard; {instead}")
    return data


class TlsServer(Strict):
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: Literal["", "NoClientCert", "RequestClientCert", "RequireAnyClientCert", "RequireClientCert",
                              "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = ""
    client_ca_file: str = ""
    client_allowed_sans: list[str] | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] = []
    prefer_server_cipher_suites: bool = True

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        return _refuse_unsupported(data)

    @model_validator(mode="after")
    def _consistent(self) -> "TlsServer":
        unknown = [c for c in self.cipher_suites if c not in CIPHERS]
        if unknown:
            raise ValueError(f"cipher_suites: unknown cipher {unknown[0]!r}; Go's names, e.g. "
                             "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
        if self.client_auth_type in ("RequireAnyClientCert", "RequireClientCert"):
            raise ValueError(f"client_auth_type: {self.client_auth_type} (a certificate required but never "
                             "checked) is not supported: Python's ssl checks every certificate it asks for; use "
                             "RequireAndVerifyClientCert with client_ca_file")
        if self.client_ca_file and self.client_auth_type in ("", "NoClientCert"):
            raise ValueError("client_ca_file is set without a client_auth_type that checks certificates: set "
                             "client_auth_type: RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
        if self.client_allowed_sans is not None and self.client_auth_type not in VERIFYING:
            raise ValueError("client_allowed_sans needs client_auth_type RequireAndVerifyClientCert "
                             "(or VerifyClientCertIfGiven): only a verified certificate's names mean anything")
        if self.enabled and not self.cert_file:
            raise ValueError("missing cert_file (TLS is on: the server needs its certificate)")
        if self.enabled and not self.key_file:
            raise ValueError("missing key_file (TLS is on: the server needs its private key)")
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self

    @property
    def enabled(self) -> bool:
        """TLS is on when any of its settings is (exporter-toolkit's rule); else the port speaks plain HTTP."""
        return bool(self.cert_file or self.key_file or self.client_ca_file or self.client_auth_type)


class HttpServer(Strict):
    http2: bool = True  # accepted for the same file's sake; the metrics port speaks HTTP/1.1 (ALPN says so)
    headers: dict[str, str] = {}

    @model_validator(mode="after")
    def _allowed_headers(self) -> "HttpServer":
        for name, value in self.headers.items():
            if name not in HEADERS:
                raise ValueError(f"headers: {name!r} can not be configured; allowed: {', '.join(HEADERS)}")
            allowed = HEADERS[name]
            if allowed is not None and value not in allowed:
                raise ValueError(f"headers: {name} must be one of {', '.join(allowed)}, got {value!r}")
            if "\n" in value or "\r" in value:
                raise ValueError(f"headers: {name} has a line break in its value")
        return self


class WebConfig(Strict):
    tls_server_config: TlsServer = TlsServer()
    http_server_config: HttpServer = HttpServer()
    basic_auth_users: dict[str, str] = {}  # user -> bcrypt hash

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        return _refuse_unsupported(data)

    @field_validator("basic_auth_users")
    @classmethod
    def _hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if ":" in user:
                raise ValueError(f"user {user!r} has a ':' (basic auth cannot send it)")
            if not BCRYPT_HASH.match(hashed):
                raise ValueError(f"the password of {user!r} is not a bcrypt hash ($2y$10$..., e.g. from "
                                 "htpasswd -nBC 10 USER)")
        return users

    def relative_to(self, directory: str) -> "WebConfig":
        """The paths in the file, relative ones joined to the file's directory."""
        tls = self.tls_server_config
        paths = {k: os.path.join(directory, getattr(tls, k)) for k in ("cert_file", "key_file", "client_ca_file")
                 if getattr(tls, k)}
        return self.model_copy(update={"tls_server_config": tls.model_copy(update=paths)})


def server_context(tls: TlsServer) -> ssl.SSLContext | None:
    """The SSL context of the metrics port, None without TLS; ValueError naming the key when a file is bad."""
    if not tls.enabled:
        return None
    for key in ("cert_file", "key_file", "client_ca_file"):
        if getattr(tls, key):
            _load(key, getattr(tls, key), lambda path: open(path, "rb").close(), getattr(tls, key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    context.set_alpn_protocols(["http/1.1"])
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    suites = [CIPHERS[c] for c in tls.cipher_suites if CIPHERS[c]]
    if suites:
        _load("cipher_suites", ", ".join(tls.cipher_suites), context.set_ciphers, ":".join(suites))
    _load("cert_file/key_file", f"{tls.cert_file}, {tls.key_file}", context.load_cert_chain, tls.cert_file,
          tls.key_file)
    # RequestClientCert: Go asks for a certificate it never checks, so it grants what not asking grants.
    context.verify_mode = VERIFYING.get(tls.client_auth_type, ssl.CERT_NONE)
    if context.verify_mode != ssl.CERT_NONE:
        if tls.client_ca_file:
            _load("client_ca_file", tls.client_ca_file, context.load_verify_locations, tls.client_ca_file)
        else:  # Go checks against the system's roots then
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


def _load(key: str, what: str, load: Any, *args: Any) -> None:
    try:
        load(*args)
    except FileNotFoundError as exc:
        raise ValueError(f"tls_server_config.{key}: file not found: {exc.filename or what}") from None
    except PermissionError as exc:
        raise ValueError(f"tls_server_config.{key}: permission denied: {exc.filename or what}") from None
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ValueError(f"tls_server_config.{key}: cannot be loaded ({what}): {reason}") from None
