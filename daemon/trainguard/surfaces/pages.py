"""Pages served next to /metrics on the metrics port (the daemon's /status page).

The metrics app (surfaces/exposition.py) keeps every other path; a page is a function returning its HTML,
called per request on the HTTP thread (it must only read immutable or its own data)."""

from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)
Page = Callable[[], str]


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per request, none of them holding up the daemon's exit."""

    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


def with_pages(app: Callable, pages: Mapping[str, Page]) -> Callable:
    def wsgi(environ: dict, start_response: Callable) -> Iterable[bytes]:
        page = pages.get(environ.get("PATH_INFO", ""))
        if page is None:
            return app(environ, start_response)
        try:
            body, status = page().encode(), "200 OK"
        except Exception:  # a page bug is a 500 for that request, not a dead metrics endpoint
            log.exception("page %s failed", environ.get("PATH_INFO"))
            body, status = b"internal error (see the trainguard log)\n", "500 Internal Server Error"
        start_response(status, [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                                ("Cache-Control", "no-store")])
        return [body]
    return wsgi


def serve(host: str, port: int, app: Callable) -> tuple[Any, threading.Thread]:
    """A threaded WSGI server on (host, port) in a daemon thread, IPv6 addresses included."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(sockaddr[0], port, app, Server, handler_class=_Quiet)
    # serve_forever looks for a shutdown request every poll_interval; the default 0.5 s woke an idle
    # daemon twice a second, more CPU than its cycles. shut_down() wakes it with a connection instead.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 3600.0}, daemon=True)
    thread.start()
    return httpd, thread


def shut_down(httpd: Any, thread: threading.Thread, timeout: float = 5.0) -> None:
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
