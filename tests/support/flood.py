"""Clients that flood a metrics port on loopback, for the attack tests and bench/metrics_flood.py.

``Attackers``: connections that say nothing, or drip a payload (a request head, a TLS ClientHello) a byte
at a time; ``Streamers``: connections that send a request head and then stream bytes without end;
``WrongPasswords``: requests with a new wrong password each; ``Scraper``: a client scraping every
`interval` like Prometheus (one kept connection, a new one after a failure), recording each scrape's time.
Every client opens its connection again as soon as the server ends it.
"""

from __future__ import annotations

import base64
import errno
import http.client
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench._reference import rss_bytes


def client_hello(context: ssl.SSLContext) -> bytes:
    """The first flight of a TLS handshake with `context`, as bytes to drip."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Attackers(threading.Thread):
    """`count` clients on (host, port). drip=None: they connect and say nothing; else each sends one byte
    of `payload` (then of endless padding) every `drip` seconds. A connection the server ends is opened again."""

    def __init__(self, address: tuple[str, int], count: int, drip: float | None = None,
                 payload: bytes = b"GET /metrics HTTP/1.1\r\nX-Padding: "):
        super().__init__(daemon=True)
        self.address, self.count, self.drip, self.payload = address, count, drip, payload
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.dropped = 0  # connections the server ended

    def open(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(self.address)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            return
        self.selector.register(sock, selectors.EVENT_READ)

    def run(self) -> None:
        for _ in range(self.count):
            self.open()
        sent = 0
        next_drip = time.monotonic()
        while not self.stopping.is_set():
            for key, _ in self.selector.select(0.05):
                try:
                    data = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:  # dropped by the server: come back at once
                    self.dropped += 1
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self.open()
            if self.drip is not None and time.monotonic() >= next_drip:
                next_drip += self.drip
                byte = self.payload[sent:sent + 1] if sent < len(self.payload) else b"a"
                sent += 1
                for key in list(self.selector.get_map().values()):
                    try:
                        key.fileobj.send(byte)
                    except OSError:
                        pass  # not connected yet, or gone (the read side notices)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


class Streamers:
    """`count` threads, each sending a request head and then bytes as fast as the server takes them."""

    def __init__(self, address: tuple[str, int], count: int, context: ssl.SSLContext | None = None):
        self.address, self.context = address, context
        self.stopping = threading.Event()
        self.sent = 0
        self.threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(count)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _stream(self) -> None:
        chunk = b"x" * 65536
        while not self.stopping.is_set():
            try:
                with socket.create_connection(self.address, timeout=2) as raw:
                    sock = self.context.wrap_socket(raw, server_hostname="localhost") if self.context else raw
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    while not self.stopping.is_set():
                        sock.sendall(chunk)
                        self.sent += len(chunk)
            except (OSError, ValueError):
                time.sleep(0.01)  # ended by the server: again

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)


class WrongPasswords(threading.Thread):
    """`count` requests for `user`, each with a new wrong password, `parallel` at a time."""

    def __init__(self, address: tuple[str, int], user: str, count: int, parallel: int = 8,
                 context: ssl.SSLContext | None = None):
        super().__init__(daemon=True)
        self.address, self.user, self.count, self.parallel, self.context = address, user, count, parallel, context
        self.statuses: list[int] = []
        self.stopping = threading.Event()
        self._next = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        workers = [threading.Thread(target=self._work, daemon=True) for _ in range(self.parallel)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _work(self) -> None:
        while True:
            with self._lock:
                if self._next >= self.count or self.stopping.is_set():
                    return
                self._next += 1
                n = self._next
            host, port = self.address
            conn = (http.client.HTTPSConnection(host, port, timeout=30, context=self.context) if self.context
                    else http.client.HTTPConnection(host, port, timeout=30))
            try:
                conn.request("GET", "/metrics", headers={"Authorization": basic(self.user, f"guess-{n}")})
                response = conn.getresponse()
                response.read()
                self.statuses.append(response.status)
            except OSError:
                self.statuses.append(0)
            finally:
                conn.close()


    def stop(self) -> None:
        self.stopping.set()
        self.join(35)


@contextmanager
def flooded(target: tuple[str, int], context: ssl.SSLContext, user: str) -> Iterator[list]:
    """The whole flood on a TLS port with basic auth: 12 streaming clients, 300 silent ones, 20 TLS handshakes
    dripped a byte a second, and 100 wrong passwords for `user`."""
    floods = [Streamers(target, 12, context), Attackers(target, 300),
              Attackers(target, 20, drip=1.0, payload=client_hello(context)), WrongPasswords(target, user, 100, context=context)]
    for flood in floods:
        flood.start()
    try:
        yield floods
    finally:
        for flood in floods:
            flood.stop()


class Scraper(threading.Thread):
    """Scrapes `url`'s /metrics every `interval` with `timeout`, keeping its connection as Prometheus does;
    `times` holds each scrape's seconds (None: it failed), `statuses` the answers."""

    def __init__(self, host: str, port: int, *, interval: float = 1.0, timeout: float = 1.0,
                 context: ssl.SSLContext | None = None, headers: dict | None = None, fresh: bool = False):
        super().__init__(daemon=True)
        self.host, self.port, self.interval, self.timeout = host, port, interval, timeout
        self.context, self.headers, self.fresh = context, headers or {}, fresh
        self.stopping = threading.Event()
        self.times: list[float | None] = []
        self.statuses: list[int] = []
        self._conn: http.client.HTTPConnection | None = None

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            self.times.append(self.scrape())
        if self._conn is not None:
            self._conn.close()

    def scrape(self) -> float | None:
        if self._conn is None:
            self._conn = (http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
                          if self.context else http.client.HTTPConnection(self.host, self.port, timeout=self.timeout))
        started = time.monotonic()
        try:
            self._conn.request("GET", "/metrics", headers=self.headers)
            response = self._conn.getresponse()
            response.read()
            took = time.monotonic() - started
        except (OSError, http.client.HTTPException):
            self._conn.close()
            self._conn = None
            return None
        self.statuses.append(response.status)
        if self.fresh or response.will_close:
            self._conn.close()
            self._conn = None
        return took if response.status == 200 and took <= self.timeout else None

    def stop(self) -> None:
        self.stopping.set()
        self.join(self.timeout + 5)


class RssWatch(threading.Thread):
    """The most resident memory process `pid` reaches while watched, every 0.1 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.before = rss_bytes(pid)
        self.most = self.before
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            try:
                self.most = max(self.most, rss_bytes(self.pid))
            except OSError:
                return

    def stop(self) -> int:
        """The growth in bytes."""
        self.stopping.set()
        self.join(5)
        return self.most - self.before
