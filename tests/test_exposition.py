"""The /metrics text writer: what it writes parses back to what prometheus_client's own writer gives."""

from __future__ import annotations

import gzip
import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from trainguard.surfaces.exposition import MetricsApp, render, value_text


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
