"""Certificates made with the openssl command for TLS tests, and web config files that use them.

``make_pki(dir)`` writes a CA, a server certificate for 127.0.0.1/localhost signed by it, a client
certificate signed by it, and a second, unrelated CA with a client certificate of its own (one the
server must refuse). ``bcrypt_hash`` hashes at the lowest cost, so tests stay fast.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by another CA
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _signed(d: Path, name: str, ca: str, subject: str, ext: str) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)


def make_pki(d: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed (Debian package openssl)")
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN=trainguard test {ca}",
                 cwd=d)
    _signed(d, "server", "ca", "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _signed(d, "client", "ca", "/CN=prometheus",
            "subjectAltName=DNS:prometheus.example\nextendedKeyUsage=clientAuth\n")
    _signed(d, "stranger", "other-ca", "/CN=prometheus",
            "subjectAltName=DNS:prometheus.example\nextendedKeyUsage=clientAuth\n")
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
               d / "stranger.crt", d / "stranger.key")


def bcrypt_hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def write_web_config(path: Path, pki: Pki, users: dict[str, str], **extra: object) -> Path:
    """A web.yml (as JSON, which is YAML) with TLS, client certificates checked against the CA, and users."""
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
           "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    doc = {"tls_server_config": tls, "basic_auth_users": {u: bcrypt_hash(p) for u, p in users.items()}, **extra}
    path.write_text(json.dumps(doc))
    return path
