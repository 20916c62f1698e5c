"""The metrics port's limits, each at the edge where it used to give: clients streaming after their request
head, silent connections and TLS handshakes dripped a byte a second, a flood of wrong passwords, and a request
whose body's length is ambiguous. Real sockets on loopback; the heavy cases against a real `trainguard run`."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from urllib.parse import urlparse

import pytest
from trainguard import config
from trainguard.surfaces.access import BCRYPT_WAIT, Access, Verdict
from trainguard.surfaces.exposition import MetricsApp
from trainguard.surfaces.httpserver import MAX_HEAD, HttpServer
from trainguard.surfaces.pages import MAX_BODY

from tests.support.daemon_proc import DaemonProcess
from tests.support.flood import (
    Attackers,
    RssWatch,
    Scraper,
    Streamers,
    WrongPasswords,
    basic,
    client_hello,
)
from tests.support.tls import make_pki
from tests.test_exporter import config as daemon_config
from tests.test_exposition import exchange, families

MiB = 2**20


def serve(web_config=None, **limits) -> HttpServer:
    httpd = HttpServer("127.0.0.1", 0, MetricsApp(families, lambda: None), Access(web_config), **limits)
    httpd.start()
    return httpd


@pytest.mark.parametrize("headers, status", [
    (b"Content-Length: 0\r\nContent-Length: 0\r\n", b"400"),
    (b"Content-Length: 0\r\nContent-Length: 5\r\n", b"400"),
    (b"Content-Length: 5, 5\r\n", b"400"),
    (b"Content-Length: -1\r\n", b"400"),
    (b"Content-Length: 0\r\nTransfer-Encoding: chunked\r\n", b"400"),
    (f"Content-Length: {MAX_BODY + 1}\r\n".encode(), b"413"),
    (b"X-Big: " + b"a" * MAX_HEAD + b"\r\n", b"431"),
])
def test_an_ambiguous_or_oversized_request_is_refused_and_the_connection_closed(headers, status):
    httpd = serve()
    try:
        answer = exchange(httpd.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert answer.split(b" ", 2)[1] == status, answer[:200]
        assert b"\r\nConnection: close\r\n" in answer
        assert b"trainguard_" not in answer  # the app never ran
        ok = exchange(httpd.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")  # the plain request beside it
    finally:
        httpd.stop()


def plain_daemon(tmp_path, web: str = "") -> DaemonProcess:
    cfg = daemon_config(tmp_path / "state", [tmp_path], interval="1s") + web + "[gpu]\nenabled = false\n"
    return DaemonProcess(tmp_path, cfg)


def shown(scraper: Scraper) -> str:
    return " ".join("failed" if t is None else f"{t:.3f}s" for t in scraper.times) + f"; answers {scraper.statuses}"


def run_while(scraper: Scraper, seconds: float, *floods) -> None:
    for flood in floods:
        flood.start()
    time.sleep(1.0)  # the flood is on
    scraper.start()
    time.sleep(seconds)
    scraper.stop()
    for flood in floods:
        flood.stop()


@pytest.mark.slow
def test_clients_streaming_after_their_request_leave_scrapes_and_memory_alone(tmp_path):
    with plain_daemon(tmp_path) as daemon:
        address = urlparse(daemon.metrics_url(timeout=30))
        scraper = Scraper(address.hostname, address.port, timeout=1.0)
        assert scraper.scrape() is not None
        rss = RssWatch(daemon.proc.pid)
        rss.start()
        streamers = Streamers((address.hostname, address.port), 12)
        run_while(scraper, 8, streamers)
        growth = rss.stop()
    assert streamers.sent > 10 * MiB, "the flood never got going"
    assert len(scraper.times) >= 7 and None not in scraper.times, shown(scraper)  # every scrape within 1 s
    assert growth < 30 * MiB, f"RSS grew {growth / MiB:.0f} MiB"


@pytest.mark.slow
def test_slow_tls_handshakes_and_silent_connections_leave_a_new_connection_served(tmp_path):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "web.yml").write_text(f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n")
    with plain_daemon(tmp_path, f'web_config = "{tmp_path / "web.yml"}"\n') as daemon:
        address = urlparse(daemon.metrics_url(timeout=30))
        target = (address.hostname, address.port)
        context = ssl.create_default_context(cafile=str(pki.ca))
        # A new connection for every scrape: the case of Prometheus' first scrape, or one after a failure.
        scraper = Scraper(*target, timeout=1.0, context=context, fresh=True)
        idle = Attackers(target, 300)
        drip = Attackers(target, 20, drip=1.0, payload=client_hello(context))
        run_while(scraper, 8, idle, drip)
    assert len(scraper.times) >= 7 and None not in scraper.times, shown(scraper)  # every scrape within 1 s
    assert drip.dropped > 0, "the dripped handshakes never reached the server"


def test_wrong_passwords_cannot_evict_a_verified_one(tmp_path):
    import bcrypt

    slow = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(12)).decode()  # ~0.2 s a check
    fast = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{slow}'\n  guest: '{fast}'\n")
    access = Access(config.read_web_config(str(tmp_path / "web.yml")))
    started = time.monotonic()
    assert access.check(basic("prometheus", "s3cret")) is Verdict.ALLOWED
    one = time.monotonic() - started
    for n in range(300):  # three times what any cache of refusals holds
        assert access.check(basic("guest", f"guess-{n}")) is Verdict.REFUSED
    started = time.monotonic()
    assert access.check(basic("prometheus", "s3cret")) is Verdict.ALLOWED
    assert time.monotonic() - started < one / 10  # from the cache, no bcrypt


def test_a_password_check_waits_for_others_only_until_its_deadline(tmp_path):
    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode()
    started = time.monotonic()
    bcrypt.checkpw(b"s3cret", hashed.encode())
    one = time.monotonic() - started  # 0.05-0.2 s
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    httpd = serve(config.read_web_config(str(tmp_path / "web.yml")), max_connections=32)
    flood = WrongPasswords(("127.0.0.1", httpd.port), "prometheus", 40, parallel=12)
    try:
        flood.start()
        time.sleep(0.3)  # a queue of checks, 40 bcrypts long, has formed
        waited: list[float] = []
        statuses: list[int] = []

        def scrape() -> None:
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", httpd.port, timeout=30)
            conn.request("GET", "/metrics", headers={"Authorization": basic("prometheus", "s3cret")})
            statuses.append(conn.getresponse().status)
            waited.append(time.monotonic() - started)
            conn.close()

        scraping = threading.Thread(target=scrape)
        scraping.start()
        scraping.join(30)
        flood.join(60)
    finally:
        httpd.stop()
    assert statuses in ([503], [200]), statuses
    assert waited[0] < BCRYPT_WAIT + 2 * one + 0.3, f"waited {waited[0]:.1f}s for a password check"
    assert 503 in flood.statuses  # the flood itself was told to come back
