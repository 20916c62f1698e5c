"""The /metrics text writer: what it writes parses back to what prometheus_client's own writer gives;
and the HTTP server of the metrics port, over real sockets on loopback."""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import socket
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from trainguard.surfaces import pages
from trainguard.surfaces.exposition import MetricsApp, render, value_text
from trainguard.surfaces.httpserver import HttpServer


def families():
    g = GaugeMetricFamily("tg_test_bytes", 'Help with a \\ backslash\nand a newline', labels=("mountpoint", "fstype"))
    g.add_metric(("/data", "ext4"), 1.5e12)
    g.add_metric(('/odd "quoted" \\ path\nline', "fuse.juicefs"), 0.0)
    g.add_metric(("/挂载/数据", "nfs4"), float("inf"))
    g.add_metric(("/nan", "tmpfs"), float("nan"))
    g.add_metric(("/neg", "tmpfs"), -3)
    c = CounterMetricFamily("tg_test_errors", "Errors", labels=("mirror",))
    c.add_metric(("ckpt",), 7)
    plain = GaugeMetricFamily("tg_test_duration_seconds", "No labels", value=0.25)
    return [g, c, plain]


class Registry:
    def collect(self):
        return families()


def parsed(text: str) -> dict:
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            value = "nan" if math.isnan(s.value) else s.value
            out[(f.name, f.type, f.documentation, s.name, tuple(sorted(s.labels.items())))] = value
    return out


def test_the_text_parses_to_what_prometheus_clients_own_writer_gives():
    ours = render(families()).decode()
    theirs = generate_latest(Registry()).decode()
    assert parsed(ours) == parsed(theirs)
    assert len(parsed(ours)) == 7


@pytest.mark.parametrize("value, text", [(1.0, "1.0"), (1e21, "1e+21"), (float("inf"), "+Inf"),
                                         (float("-inf"), "-Inf"), (float("nan"), "NaN"), (3, "3.0")])
def test_values_are_written_as_prometheus_reads_them(value, text):
    assert value_text(value) == text


def test_a_bad_name_is_refused_not_written():
    bad = GaugeMetricFamily("tg bad", "x", value=1)
    with pytest.raises(ValueError, match="tg bad"):
        render([bad])


def call(app, **environ):
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", **environ}, start_response))
    return seen["status"], seen["headers"], body


def test_one_cycle_is_rendered_once_and_gzip_is_served_when_asked():
    calls = []
    version = [object()]

    def collect():
        calls.append(1)
        return families()

    app = MetricsApp(collect, lambda: version[0])
    status, headers, plain = call(app)
    assert status == "200 OK" and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    _, zheaders, zipped = call(app, HTTP_ACCEPT_ENCODING="gzip, deflate")
    assert zheaders["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == plain
    assert len(calls) == 1  # same readings: the body was kept
    version[0] = object()  # the next cycle
    call(app)
    assert len(calls) == 2


def test_before_the_first_cycle_every_scrape_renders_and_other_methods_are_refused():
    calls = []
    app = MetricsApp(lambda: calls.append(1) or families(), lambda: None)
    call(app)
    call(app)
    assert len(calls) == 2
    status, headers, _ = call(app, REQUEST_METHOD="POST")
    assert status.startswith("405") and "GET" in headers["Allow"]
    status, headers, body = call(app, REQUEST_METHOD="HEAD")
    assert status == "200 OK" and body == b"" and int(headers["Content-Length"]) > 0


def test_written_series_follow_their_labels_across_scrapes():
    from trainguard.surfaces.exposition import Names

    names = Names()

    def one(mountpoint, value):
        g = GaugeMetricFamily("tg_test_bytes", "x", labels=("mountpoint",))
        g.add_metric((mountpoint,), value)
        return render([g], names).decode()

    assert 'tg_test_bytes{mountpoint="/a"} 1.0' in one("/a", 1)
    assert 'tg_test_bytes{mountpoint="/a"} 2.0' in one("/a", 2)  # the value is never kept
    assert 'tg_test_bytes{mountpoint="/b"} 3.0' in one("/b", 3)
    names.MAX_SERIES = 2
    one("/c", 4)
    assert len(names.series) <= 2  # a churning label set does not grow it without bound


class Broken:
    """collect() for a MetricsApp that fails while `failing` is set."""

    failing = False

    def __call__(self):
        if self.failing:
            raise RuntimeError("collector bug")
        return families()


@pytest.fixture
def served():
    """A MetricsApp with a /status page on 127.0.0.1; yields (port, Broken)."""
    broken = Broken()
    app = pages.with_pages(MetricsApp(broken, lambda: None), {"/status": lambda: "<p>ok</p>"})
    httpd = serve(app)
    yield httpd.port, broken
    httpd.stop()


def serve(app, host: str = "127.0.0.1", **limits) -> HttpServer:
    httpd = HttpServer(host, 0, app, **limits)
    httpd.start()
    return httpd


def connection(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=5)


def exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a new connection; all the server answered until it closed (a timeout fails)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_a_keep_alive_connection_is_kept_from_one_scrape_to_the_next(served):
    port, _ = served
    conn = connection(port)
    conn.request("GET", "/metrics")
    first = conn.getresponse()
    plain = first.read()
    sock = conn.sock
    conn.request("GET", "/metrics?x=1", headers={"Accept-Encoding": "gzip"})
    second = conn.getresponse()
    assert first.status == second.status == 200 and conn.sock is sock is not None
    assert second.getheader("Content-Encoding") == "gzip" and gzip.decompress(second.read()) == plain
    assert parsed(plain.decode()) == parsed(render(families()).decode())
    conn.close()


def test_keep_alive_answers_are_not_held_back_by_nagle(served):
    port, _ = served
    conn = connection(port)
    started = time.monotonic()
    for _ in range(10):  # headers and body in two writes, Nagle on: each answer waits ~40 ms for an ACK
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        conn.getresponse().read()
    assert time.monotonic() - started < 0.3
    conn.close()


def test_head_405_and_the_status_page_on_one_connection(served):
    port, _ = served
    conn = connection(port)
    conn.request("HEAD", "/metrics")
    head = conn.getresponse()
    assert head.status == 200 and int(head.getheader("Content-Length")) > 0 and head.read() == b""
    conn.request("POST", "/metrics")
    refused = conn.getresponse()
    assert refused.status == 405 and "GET" in refused.getheader("Allow") and b"405" in refused.read()
    conn.request("GET", "/%73tatus?x=1")  # the path decoded, the query apart, as WSGI has them
    page = conn.getresponse()
    assert page.status == 200 and page.read() == b"<p>ok</p>" and page.getheader("Content-Type").startswith("text/html")
    conn.close()


def test_a_malformed_request_is_answered_400_and_closed(served):
    port, _ = served
    assert exchange(port, b"GET /metrics HTTP/1.1 junk\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert exchange(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_connection_close_from_the_client_is_honoured(served):
    port, _ = served
    answer = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nConnection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head


def test_a_page_error_is_a_500_logged_once_and_metrics_are_still_served(caplog):
    def failing() -> str:
        raise RuntimeError("page bug")

    app = pages.with_pages(MetricsApp(families, lambda: None), {"/status": failing})
    httpd = serve(app)
    try:
        conn = connection(httpd.port)
        with caplog.at_level(logging.ERROR, logger="trainguard.surfaces.pages"):
            conn.request("GET", "/status")
            failed = conn.getresponse()
            assert failed.status == 500 and b"trainguard log" in failed.read()
        assert [r.exc_info[0] for r in caplog.records] == [RuntimeError]
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        httpd.stop()


def test_an_app_error_is_a_500_logged_once_and_the_next_scrape_is_served(served, caplog):
    port, broken = served
    conn = connection(port)
    broken.failing = True
    with caplog.at_level(logging.ERROR, logger="trainguard.surfaces.pages"):
        conn.request("GET", "/metrics")
        failed = conn.getresponse()
        assert failed.status == 500 and b"trainguard log" in failed.read()
    assert [r.exc_info[0] for r in caplog.records] == [RuntimeError]
    broken.failing = False
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200
    conn.close()


def test_a_silent_client_does_not_stop_others_and_a_stalled_one_is_dropped():
    httpd = serve(MetricsApp(families, lambda: None), head_deadline=0.5)
    try:
        with socket.create_connection(("127.0.0.1", httpd.port), timeout=5):  # connects and says nothing
            conn = connection(httpd.port)
            conn.request("GET", "/metrics")
            assert conn.getresponse().status == 200
            conn.close()
        started = time.monotonic()
        assert exchange(httpd.port, b"GET /metr") == b""  # half a request line, then nothing: closed, unanswered
        assert 0.4 < time.monotonic() - started < 2
    finally:
        httpd.stop()


def test_shut_down_is_prompt_with_an_idle_keep_alive_connection_open():
    httpd = serve(MetricsApp(families, lambda: None))
    conn = connection(httpd.port)
    conn.request("GET", "/metrics")
    conn.getresponse().read()
    started = time.monotonic()
    httpd.stop()
    assert time.monotonic() - started < 2 and not httpd.thread.is_alive()
    assert conn.sock.recv(1) == b""  # the stopped server answers no more scrapes on it
    conn.close()


def test_an_ipv6_listen_address_is_served():
    try:
        httpd = serve(MetricsApp(families, lambda: None), "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    try:
        conn = http.client.HTTPConnection("::1", httpd.port, timeout=5)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        httpd.stop()
