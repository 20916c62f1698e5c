"""/metrics in Prometheus' text format (0.0.4), written for the cost of a scrape.

prometheus_client's generate_latest checks and escapes every label name of every sample with
regular expressions: 5-6 µs a sample, 2.5 ms of a 450-series scrape (30 mounts, 8 GPUs), more CPU
than a 10 s cycle's sampling spends between two 15 s scrapes. The families here come from our own
collector, whose metric and label names are fixed identifiers, so a name is checked once when first
seen and a label value is escaped only when it holds a character that needs it. The families are
still prometheus_client's (surfaces/exporter.py); tests/test_exposition.py parses this output back
and compares it with generate_latest's. The body of one cycle's Readings is kept, so a second
scraper (an HA pair of Prometheus servers) costs nothing more, and gzip is applied when asked for
(Prometheus always asks), at its fastest level.
"""

from __future__ import annotations

import gzip
import math
import re
import threading
from typing import Callable, Iterable

from prometheus_client.core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# Level 1, not Go's default 6: on the body of 30 mounts and 8 GPUs (47.7 KB, bench/bench_scrape.py's readings)
# it takes 0.07 ms against 0.30 ms for 5.4 KB against 4.7 KB (50 mounts: 0.11 against 0.43 ms, 6.7 against
# 5.8 KB). 0.7 KB more is nothing to a network; 0.23 ms is more than the rest of a kept-alive scrape costs.
GZIP_LEVEL = 1


def value_text(value: float) -> str:
    """A sample value as Prometheus writes it: repr for finite floats, +Inf, -Inf, NaN."""
    v = float(value)
    if math.isfinite(v):
        return repr(v)
    return "NaN" if v != v else ("+Inf" if v > 0 else "-Inf")


def _escaped(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class Names:
    """Valid metric and label names, each checked once per process, and each series' written name and
    labels (`name{a="x",b="y"}`), kept while the series lives: mounts and GPUs change rarely."""

    MAX_SERIES = 20_000  # a label set that churns cannot grow it without bound

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.series: dict[tuple, str] = {}

    def check(self, name: str) -> str:
        if name not in self.seen:
            if not NAME.match(name) or name.startswith("__"):
                raise ValueError(f"invalid metric or label name {name!r}")
            self.seen.add(name)
        return name

    def head(self, name: str, labels: dict[str, str]) -> str:
        key = (name, *labels.items())
        head = self.series.get(key)
        if head is None:
            if len(self.series) >= self.MAX_SERIES:
                self.series.clear()
            pairs = ",".join(f'{self.check(k)}="{_escaped(str(v))}"' for k, v in labels.items())
            head = self.series[key] = f"{self.check(name)}{{{pairs}}}" if pairs else self.check(name)
        return head


def render(families: Iterable[Metric], names: Names | None = None) -> bytes:
    """The text exposition of `families` (gauges and counters; counters' samples end in _total)."""
    names = names or Names()
    out: list[str] = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        kind = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}.get(family.type, family.type)
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {names.check(name)} {help_text}\n# TYPE {name} {kind}\n")
        for s in family.samples:
            out.append(f"{names.head(s.name, s.labels)} {value_text(s.value)}\n")
    return "".join(out).encode()


class MetricsApp:
    """The WSGI app for /metrics: GET renders the collector's families (any path, like prometheus_client)."""

    def __init__(self, collect: Callable[[], Iterable[Metric]], version: Callable[[], object]):
        self.collect = collect
        self.version = version  # what the body depends on: the latest Readings object
        self.names = Names()
        self._lock = threading.Lock()
        self._cached: tuple[object, bytes, bytes | None] | None = None

    def body(self, zipped: bool) -> bytes:
        with self._lock:  # two scrapes at once render once
            version = self.version()
            if self._cached is None or self._cached[0] is not version or version is None:
                self._cached = (version, render(self.collect(), self.names), None)
            _, plain, packed = self._cached
            if not zipped:
                return plain
            if packed is None:
                packed = gzip.compress(plain, compresslevel=GZIP_LEVEL)
                self._cached = (version, plain, packed)
            return packed

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [f"# HTTP 405: {method}; use GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("204 No Content", [])
            return [b""]
        zipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = self.body(zipped)
        headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [b"" if method == "HEAD" else body]
