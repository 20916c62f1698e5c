"""Pages served next to /metrics on the metrics port (the daemon's /status page), and the HTTP server of that port.

The metrics app (surfaces/exposition.py) keeps every other path; a page is a function returning its HTML,
called per request on the HTTP thread (it must only read immutable or its own data).

The server speaks HTTP/1.1 with keep-alive: Prometheus keeps its scrape connection open, so a scrape costs
neither an accept nor a thread start. wsgiref closed the connection after each request and built a full
WSGI environ (a copy of the process environment) for it: 0.4-0.6 ms of server CPU a scrape, against
0.1-0.2 ms now on a kept connection. The apps are still WSGI callables, given the environ keys they read.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote

log = logging.getLogger(__name__)
Page = Callable[[], str]
ERROR_BODY = b"internal error (see the trainguard log)\n"


def with_pages(app: Callable, pages: Mapping[str, Page]) -> Callable:
    def wsgi(environ: dict, start_response: Callable) -> Iterable[bytes]:
        page = pages.get(environ.get("PATH_INFO", ""))
        if page is None:
            return app(environ, start_response)
        body = page().encode()  # a page that raises is a 500 for that request, as any app error (Handler.answer)
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                                  ("Cache-Control", "no-store")])
        return [body]
    return wsgi


class Handler(BaseHTTPRequestHandler):
    """Every request of a connection, each answered by the server's WSGI app."""

    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a malformed request line still gets a status line (0.9 answers have none)
    # A connection idle this long is closed, and so is one stalled inside a request: neither holds its thread
    # for good. Longer than any usual scrape interval, so Prometheus' connection lives from scrape to scrape.
    timeout = 120.0
    disable_nagle_algorithm = True  # headers and body are two writes: the body must not wait for an ACK
    server: Server

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # every method goes to the app, which answers 405 to those it does not serve
            return self.answer
        raise AttributeError(name)

    def answer(self) -> None:
        path, _, query = self.path.partition("?")
        environ = {"REQUEST_METHOD": self.command, "PATH_INFO": unquote(path, "iso-8859-1"), "QUERY_STRING": query,
                   "HTTP_ACCEPT_ENCODING": self.headers.get("Accept-Encoding", ""),
                   "SERVER_PROTOCOL": self.request_version}
        started: list = []

        def start_response(status: str, headers: list, exc_info: Any = None) -> None:
            started[:] = status, headers

        try:
            body = b"".join(self.server.app(environ, start_response))
            status, headers = started
        except Exception:  # an app bug is a 500 for that request, not a dead metrics endpoint
            log.exception("%s %s failed", self.command, path)
            body, status, headers = ERROR_BODY, "500 Internal Server Error", [("Content-Type", "text/plain")]
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason)
        length = str(len(body))  # HEAD: the app's own Content-Length, that of the body GET would get
        for name, value in headers:
            if name.lower() == "content-length":
                length = value
            else:
                self.send_header(name, value)
        if code not in ("204", "304"):
            self.send_header("Content-Length", length)
        if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # a body left unread would be read as the next request
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class Server(ThreadingHTTPServer):
    """A thread per connection; server_close() also ends the connections still open (an idle keep-alive
    one included), so a stopped server answers no more scrapes, e.g. after its listen address changed."""

    daemon_threads = True  # none of them holds up the daemon's exit

    def __init__(self, address: tuple, app: Callable, family: int):
        self.address_family = family
        self.app = app
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with self._open_lock:
            for conn in self._open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # wakes its thread, waiting for the next request, with EOF
                except OSError:
                    pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client gone mid-answer is its own business
            log.exception("HTTP connection from %s failed", client_address)


def serve(host: str, port: int, app: Callable) -> tuple[Server, threading.Thread]:
    """The HTTP server of `app` on (host, port) in a daemon thread, IPv6 addresses included."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    httpd = Server((sockaddr[0], port), app, family)
    # serve_forever looks for a shutdown request every poll_interval; the default 0.5 s woke an idle
    # daemon twice a second, more CPU than its cycles. shut_down() wakes it with a connection instead.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 3600.0}, daemon=True)
    thread.start()
    return httpd, thread


def shut_down(httpd: Server, thread: threading.Thread, timeout: float = 5.0) -> None:
    """Stop serve_forever now: ask, then connect until its loop has seen the request."""
    asking = threading.Thread(target=httpd.shutdown, daemon=True)
    asking.start()
    host, port = httpd.server_address[:2]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    for _ in range(int(timeout / 0.05)):
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except OSError:
            pass
        asking.join(0.05)
        if not asking.is_alive():
            break
    httpd.server_close()
    thread.join(timeout=timeout)
