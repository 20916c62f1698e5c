"""Pages served next to /metrics on the metrics port (the daemon's /status page), and the answer to one
request on that port.

The metrics app (surfaces/exposition.py) keeps every other path; a page is a function returning its HTML,
called per request on a worker thread (it must only read immutable or its own data).

The server (surfaces/httpserver.py) hands over a complete request head; `answer` parses it with http.server's
parser and returns the whole response, which the server writes within the request's deadline. The apps are
WSGI callables, given the environ keys they read: a full WSGI environ (a copy of the process environment, as
wsgiref built) cost 0.4-0.6 ms of CPU a scrape.
"""

from __future__ import annotations

import io
import logging
import re
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote

from trainguard.surfaces.access import Access, Verdict

log = logging.getLogger(__name__)
Page = Callable[[], str]
ERROR_BODY = b"internal error (see the trainguard log)\n"
# No page reads a request body: one is left unread and the connection closed after the answer. A body
# announced over this is refused before the app runs.
MAX_BODY = 64 * 1024
_LENGTH = re.compile(r"[0-9]{1,18}")


def with_pages(app: Callable, pages: Mapping[str, Page]) -> Callable:
    def wsgi(environ: dict, start_response: Callable) -> Iterable[bytes]:
        page = pages.get(environ.get("PATH_INFO", ""))
        if page is None:
            return app(environ, start_response)
        body = page().encode()  # a page that raises is a 500 for that request, as any app error (Exchange.answer)
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                                  ("Cache-Control", "no-store")])
        return [body]
    return wsgi


def refusal(status: str, access: Access) -> bytes:
    """A whole answer that closes the connection, for a request the server refuses before parsing it."""
    body = f"{status}\n".encode()
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in access.headers),
             "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}", "Connection: close"]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


def answer(head: bytes, app: Callable, access: Access) -> tuple[bytes, bool]:
    """(the response to the request `head`, whether the connection stays open for the next one)."""
    exchange = Exchange(head, app, access)
    return exchange.wfile.getvalue(), not exchange.close_connection


class Exchange(BaseHTTPRequestHandler):
    """One request, answered by the WSGI app into a buffer."""

    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a malformed request line still gets a status line (0.9 answers have none)

    def __init__(self, head: bytes, app: Callable, access: Access):  # no socket: the server owns it
        self.rfile, self.wfile = io.BytesIO(head), io.BytesIO()
        self.app, self.access = app, access
        self.close_connection = True
        self.handle_one_request()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # every method goes to the app, which answers 405 to those it does not serve
            return self.answer
        raise AttributeError(name)

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        for name, value in self.access.headers:  # the web config's headers go on every answer, errors included
            self.send_header(name, value)

    def answer(self) -> None:
        refused = self.framing()
        if refused:
            self.close_connection = True
            self.reply(refused, [("Content-Type", "text/plain; charset=utf-8")], f"{refused}\n".encode())
            return
        verdict = self.access.check(self.headers.get("Authorization"))
        if verdict is not Verdict.ALLOWED:
            self.close_connection = True  # only an authorised client keeps a connection (httpserver.py)
            if verdict is Verdict.BUSY:  # too many password checks at once: not a wrong password
                self.reply("503 Service Unavailable", [("Retry-After", "1"), ("Content-Type", "text/plain")],
                           b"busy checking passwords, try again\n")
                return
            self.reply("401 Unauthorized", [("WWW-Authenticate", "Basic"), ("Content-Type", "text/plain; charset=utf-8")],
                       b"Unauthorized\n")
            return
        path, _, query = self.path.partition("?")
        environ = {"REQUEST_METHOD": self.command, "PATH_INFO": unquote(path, "iso-8859-1"), "QUERY_STRING": query,
                   "HTTP_ACCEPT_ENCODING": self.headers.get("Accept-Encoding", ""),
                   "SERVER_PROTOCOL": self.request_version}
        started: list = []

        def start_response(status: str, headers: list, _exc_info: Any = None) -> None:
            started[:] = status, headers

        try:
            body = b"".join(self.app(environ, start_response))
            status, headers = started
        except Exception:  # an app bug is a 500 for that request, not a dead metrics endpoint
            log.exception("%s %s failed", self.command, path)
            body, status, headers = ERROR_BODY, "500 Internal Server Error", [("Content-Type", "text/plain")]
        self.reply(status, headers, body)

    def framing(self) -> str | None:
        """The refusal of a request whose body's length is ambiguous (a request-smuggling vector) or over
        MAX_BODY; None when it may be answered."""
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not _LENGTH.fullmatch(lengths[0].strip(" \t"))):
            return "400 Bad Request"
        if lengths and "Transfer-Encoding" in self.headers:
            return "400 Bad Request"
        if lengths and int(lengths[0]) > MAX_BODY:
            return "413 Content Too Large"
        return None

    def reply(self, status: str, headers: list, body: bytes) -> None:
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
