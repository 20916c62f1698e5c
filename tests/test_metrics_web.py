"""The metrics port behind exporter-toolkit's web config (TLS, client certificates, bcrypt basic auth,
headers), and its limits (connection cap, kept-alive connections given up for new ones, deadlines), over
real sockets on loopback with certificates made by openssl."""

from __future__ import annotations

import base64
import http.client
import signal
import socket
import ssl
import time
from urllib.parse import urlparse

import pytest
from trainguard import config
from trainguard.config import ConfigError
from trainguard.surfaces import pages
from trainguard.surfaces.access import Access, Verdict
from trainguard.surfaces.exposition import MetricsApp
from trainguard.surfaces.httpserver import YIELD_AFTER, HttpServer

from tests.support.daemon_proc import DaemonProcess
from tests.support.tls import Pki, make_pki, write_web_config
from tests.test_exposition import families


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def web(tmp_path, pki, users=None, **extra):
    path = write_web_config(tmp_path / "web.yml", pki, {"prometheus": "s3cret"} if users is None else users, **extra)
    return config.read_web_config(str(path))


def serve(app=None, web_config=None, **limits) -> HttpServer:
    httpd = HttpServer("127.0.0.1", 0, app or MetricsApp(families, lambda: None), Access(web_config), **limits)
    httpd.start()
    return httpd


def client_context(pki: Pki, cert: bool = True, stranger: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(*((pki.stranger_cert, pki.stranger_key) if stranger else (pki.client_cert, pki.client_key)))
    return context


def auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(httpd: HttpServer, context=None, headers=None, path="/metrics") -> http.client.HTTPResponse:
    conn = (http.client.HTTPSConnection("127.0.0.1", httpd.port, timeout=5, context=context) if context
            else http.client.HTTPConnection("127.0.0.1", httpd.port, timeout=5))
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def test_tls_with_a_client_certificate_and_the_right_password_is_served_with_the_headers(tmp_path, pki):
    cfg = web(tmp_path, pki, http_server_config={"headers": {"X-Frame-Options": "deny",
                                                             "Strict-Transport-Security": "max-age=31536000"}})
    httpd = serve(web_config=cfg)
    try:
        ok = get(httpd, client_context(pki), auth("prometheus", "s3cret"))
        assert ok.status == 200 and ok.getheader("X-Frame-Options") == "deny"
        assert ok.getheader("Strict-Transport-Security") == "max-age=31536000"
        for headers in (auth("prometheus", "wrong"), auth("nobody", "s3cret"), {}, {"Authorization": "Bearer x"},
                        {"Authorization": "Basic !!!"}):
            refused = get(httpd, client_context(pki), headers)
            assert refused.status == 401 and refused.getheader("WWW-Authenticate") == "Basic", headers
            assert refused.getheader("X-Frame-Options") == "deny"  # on every answer, as exporter-toolkit does
        assert get(httpd, client_context(pki), auth("prometheus", "s3cret"), path="/status").status == 200
    finally:
        httpd.stop()


@pytest.mark.parametrize("stranger", [False, True], ids=["no-certificate", "another-ca"])
def test_a_client_without_a_trusted_certificate_is_refused_in_the_handshake(tmp_path, pki, stranger):
    httpd = serve(web_config=web(tmp_path, pki))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(httpd, client_context(pki, cert=stranger, stranger=stranger), auth("prometheus", "s3cret"))
        assert get(httpd, client_context(pki), auth("prometheus", "s3cret")).status == 200  # still serving
        with pytest.raises(ConnectionError):  # plain HTTP on the TLS port gets nothing (RemoteDisconnected is one)
            get(httpd)
    finally:
        httpd.stop()


def test_client_allowed_sans_admit_only_certificates_naming_them(tmp_path, pki):
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "client_ca_file": str(pki.ca),
           "client_auth_type": "RequireAndVerifyClientCert"}
    for sans, admitted in ((["prometheus.example"], True), (["other.example", "127.0.0.1"], False)):
        path = tmp_path / "sans.yml"
        path.write_text(f"tls_server_config: {dict(tls, client_allowed_sans=sans)}")
        httpd = serve(web_config=config.read_web_config(str(path)))
        try:
            if admitted:
                assert get(httpd, client_context(pki)).status == 200
            else:
                with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
                    get(httpd, client_context(pki))
        finally:
            httpd.stop()


def test_a_right_password_costs_one_bcrypt_then_the_cache_answers(tmp_path, pki):
    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(12)).decode()  # ~0.2 s a check
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    access = Access(config.read_web_config(str(tmp_path / "web.yml")))
    started = time.monotonic()
    assert access.check(auth("prometheus", "s3cret")["Authorization"]) is Verdict.ALLOWED
    one = time.monotonic() - started
    assert access.check(auth("prometheus", "wrong")["Authorization"]) is Verdict.REFUSED
    started = time.monotonic()
    for _ in range(20):
        assert access.check(auth("prometheus", "s3cret")["Authorization"]) is Verdict.ALLOWED
        assert access.check(auth("prometheus", "wrong")["Authorization"]) is Verdict.REFUSED
    assert time.monotonic() - started < one / 4  # 40 checks answered from the cache


@pytest.mark.parametrize("text, where", [
    ("tls_server_config: {cert_file: missing.pem, key_file: missing.key}", "tls_server_config.cert_file: file not found"),
    ("tls_server_config: {cert_file: server.crt}", "tls_server_config: missing key_file"),
    ("tls_server_config: {min_version: TLS9}", "tls_server_config.min_version"),
    ("tls_server_config: {cipher_suites: [RC4]}", "cipher_suites: unknown cipher 'RC4'"),
    ("tls_server_config: {client_auth_type: Sometimes}", "tls_server_config.client_auth_type"),
    ("tls_server_config: {client_ca_file: ca.crt, cert_file: server.crt, key_file: server.key}",
     "client_ca_file is set without a client_auth_type"),
    ("tls_server_config: {curve_preferences: [X25519]}", "curve_preferences: not supported"),
    ("basic_auth_users: {alice: hunter22-plain}", "basic_auth_users: the password of 'alice' is not a bcrypt hash"),
    ("http_server_config: {headers: {Server: x}}", "headers: 'Server' can not be configured"),
    ("basic_auth_user: {}", "basic_auth_user: unknown key"),
    ("tls_server_config: [", "YAML syntax error at line 1"),
])
def test_a_bad_web_config_is_one_line_naming_the_file_and_key_without_secrets(tmp_path, pki, text, where):
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes(getattr(pki, {"server.crt": "server_cert", "server.key": "server_key",
                                                    "ca.crt": "ca"}[name]).read_bytes())
    (tmp_path / "web.yml").write_text(text)
    (tmp_path / "config.toml").write_text(f'[metrics]\nweb_config = "{tmp_path / "web.yml"}"\n')
    with pytest.raises(ConfigError) as caught:
        config.load(str(tmp_path / "config.toml"))
    (line,) = caught.value.lines
    assert line.startswith(f"{tmp_path / 'web.yml'} (metrics.web_config): ") and where in line, line
    assert "hunter22" not in line


def test_a_key_that_does_not_match_its_certificate_and_the_env_variable_are_named(tmp_path, pki):
    (tmp_path / "web.yml").write_text(f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.client_key}}}")
    with pytest.raises(ConfigError) as caught:
        config.load("/dev/null", {"TRAINGUARD_METRICS__WEB_CONFIG": str(tmp_path / "web.yml")})
    assert caught.value.lines == [f"{tmp_path / 'web.yml'} (TRAINGUARD_METRICS__WEB_CONFIG): tls_server_config."
                                  f"cert_file/key_file: cannot be loaded ({pki.server_cert}, {pki.client_key}): "
                                  "KEY_VALUES_MISMATCH"]


def test_relative_paths_are_relative_to_the_web_config(tmp_path, pki):
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "web.yml").write_text(f"tls_server_config: {{cert_file: ../pki/server.crt, "
                                              f"key_file: {pki.server_key.name}}}")
    (tmp_path / "tls" / pki.server_key.name).write_bytes(pki.server_key.read_bytes())
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "server.crt").write_bytes(pki.server_cert.read_bytes())
    loaded = config.read_web_config(str(tmp_path / "tls" / "web.yml"))
    assert loaded.tls_server_config.cert_file == str(tmp_path / "tls" / "../pki/server.crt")
    httpd = serve(web_config=loaded)
    try:
        assert get(httpd, ssl.create_default_context(cafile=str(pki.ca))).status == 200
    finally:
        httpd.stop()


def silent(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_new_connection_that_has_not_sent_its_request_yields_to_a_waiting_one():
    httpd = serve(max_connections=4, head_deadline=5.0)
    try:
        kept = http.client.HTTPConnection("127.0.0.1", httpd.port, timeout=5)
        kept.request("GET", "/metrics")
        kept.getresponse().read()
        partial = [silent(httpd.port), silent(httpd.port)]  # half of 4: new connections are full
        first = time.monotonic()  # the kernel hands each over once it has sent something: after this
        for sock in partial:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            time.sleep(0.05)
        waiting = silent(httpd.port)
        waiting.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(3):  # the kept connection is answered at once meanwhile
            kept.request("GET", "/metrics")
            assert kept.getresponse().read()
        assert waiting.recv(12) == b"HTTP/1.1 200"
        took = time.monotonic() - first
        assert YIELD_AFTER <= took < 2.5, took  # the oldest gave its place after YIELD_AFTER, not at its deadline
        partial[0].settimeout(1)
        assert partial[0].recv(1) == b""  # the oldest one
        partial[1].setblocking(False)
        with pytest.raises(BlockingIOError):  # the younger one is still open
            partial[1].recv(1)
        for sock in (*partial, waiting):
            sock.close()
        kept.close()
    finally:
        httpd.stop()


def test_connections_that_say_nothing_take_no_slot():
    httpd = serve(max_connections=2, head_deadline=5.0)
    try:
        quiet = [silent(httpd.port) for _ in range(20)]
        time.sleep(0.2)
        started = time.monotonic()
        assert get(httpd).status == 200
        assert time.monotonic() - started < 0.5  # not at a silent one's head deadline
        for sock in quiet:
            sock.close()
    finally:
        httpd.stop()


def test_at_the_cap_the_longest_idle_kept_connection_is_closed_for_a_new_one():
    httpd = serve(max_connections=2)
    try:
        first, second = (http.client.HTTPConnection("127.0.0.1", httpd.port, timeout=5) for _ in range(2))
        for conn in (first, second):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        sock = first.sock
        third = http.client.HTTPConnection("127.0.0.1", httpd.port, timeout=5)
        third.request("GET", "/metrics")
        assert third.getresponse().status == 200
        assert sock.recv(1) == b""  # the first (idle longest) was closed for it
        second.request("GET", "/metrics")
        assert second.getresponse().status == 200  # the second is still kept
        for conn in (first, second, third):
            conn.close()
    finally:
        httpd.stop()


def test_a_client_dripping_its_request_is_cut_at_the_head_deadline():
    httpd = serve(head_deadline=1.0)
    try:
        drip = silent(httpd.port)
        started = time.monotonic()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                drip.sendall(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - started > 5:
                    break
        assert 0.9 < time.monotonic() - started < 2.5
        drip.close()
    finally:
        httpd.stop()


def test_a_client_that_does_not_read_its_answer_is_cut_at_the_request_deadline():
    big = "x" * (64 * 2**20)  # more than the socket buffers hold
    httpd = serve(pages.with_pages(MetricsApp(families, lambda: None), {"/big": lambda: big}), request_deadline=1.0)
    try:
        reader = silent(httpd.port)
        reader.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(1.5)
        assert get(httpd).status == 200  # others are served meanwhile
        reader.settimeout(5)
        received = 0
        while chunk := reader.recv(2**20):
            received += len(chunk)
        assert received < len(big)  # closed before it was all written
        reader.close()
    finally:
        httpd.stop()


def test_sighup_with_a_bad_web_config_is_one_line_and_the_port_keeps_its_settings(tmp_path, pki):
    web_path = write_web_config(tmp_path / "web.yml", pki, {"prometheus": "old-pass"})
    cfg = f'[general]\nstate_dir = "{tmp_path / "state"}"\ninterval = "0.5s"\n[filesystems]\npaths = ["{tmp_path}"]\n' \
          f'exclude = ["*"]\n[metrics]\nlisten = "127.0.0.1:0"\nweb_config = "{web_path}"\n[gpu]\nenabled = false\n'
    with DaemonProcess(tmp_path, cfg) as daemon:
        port = urlparse(daemon.metrics_url(timeout=30)).port
        target = type("Target", (), {"port": port})

        def status(password: str) -> int:
            return get(target, client_context(pki), auth("prometheus", password)).status

        assert status("old-pass") == 200
        web_path.write_text("tls_server_config: {cert_file: server.crt, key_file: /nonexistent/server.key}\n")
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("reload rejected")
        (line,) = [x for x in daemon.log.splitlines() if "reload rejected" in x]
        assert f"{web_path} (metrics.web_config): tls_server_config.cert_file: file not found" in line
        assert status("old-pass") == 200 and status("new-pass") == 401  # the old server, as it was
        write_web_config(web_path, pki, {"prometheus": "new-pass"})
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("configuration reloaded")
        assert status("new-pass") == 200 and status("old-pass") == 401  # same port, the new users
        assert "old-pass" not in daemon.log and "new-pass" not in daemon.log
