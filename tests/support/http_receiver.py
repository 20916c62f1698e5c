"""A real HTTP server on 127.0.0.1 that records requests and follows a response script.

Used to test webhook-style notifiers end to end::

    with HttpReceiver() as receiver:
        receiver.fail_next(2, status=503)      # the next two requests get 503
        send_alert(receiver.url + "/hook")
        first, second, third = receiver.wait_for(3, timeout=5)
        assert third.json()["status"] == "firing"

``stop()`` closes the listening socket (clients get "connection refused") and
``start()`` binds the *same* port again, to test retry and recovery.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as it arrived. ``headers`` keys are lower-case; ``query`` maps a name to all its values."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    arrived_at: float  # time.monotonic() when the body had been read
    status: int = 200  # the status the response plan chose for it

    def json(self) -> Any:
        """The body decoded as JSON (raises ValueError when it is not JSON)."""
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Step:
    status: int
    hang_s: float = 0.0


class HttpReceiver:
    """Threaded HTTP/1.0 server on an ephemeral loopback port.

    Every method (GET, POST, PUT, ...) is recorded.  Responses follow the plan
    built with ``fail_next`` / ``hang_next``, then ``default_status``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, default_status: int = 200,
                 response_body: bytes = b"ok") -> None:
        self.host = host
        self.port = port
        self.default_status = default_status
        self.response_body = response_body
        self._cond = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._plan: deque[_Step] = deque()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash); valid across stop/start."""
        if not self.port:
            raise RuntimeError("HttpReceiver has no port until started")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> HttpReceiver:
        """Listen (again) on the same port; the first start picks a free one."""
        if self._server is not None:
            raise RuntimeError("HttpReceiver is already running")
        self._stopping.clear()
        server = ThreadingHTTPServer((self.host, self.port), self._handler_class())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"http-receiver-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket; requests being hung are answered at once."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> HttpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- script

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next ``n`` requests with ``status`` (after anything already planned)."""
        with self._cond:
            self._plan.extend(_Step(status) for _ in range(n))

    def hang_next(self, n: int, seconds: float, status: int | None = None) -> None:
        """Hold the next ``n`` requests ``seconds`` before answering (to trip client timeouts)."""
        with self._cond:
            self._plan.extend(_Step(status or self.default_status, seconds) for _ in range(n))

    def _next_step(self) -> _Step:
        with self._cond:
            return self._plan.popleft() if self._plan else _Step(self.default_status)

    # -- observations

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests recorded so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    def clear(self) -> None:
        """Forget recorded requests and the remaining plan."""
        with self._cond:
            self._requests.clear()
            self._plan.clear()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``count`` requests arrived and return them all; TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived within {timeout}s")
            return list(self._requests)

    def _record(self, request: RecordedRequest) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: after stop() nothing is left open

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length > 0 else b""
                split = urlsplit(self.path)
                step = receiver._next_step()
                receiver._record(RecordedRequest(
                    method=self.command, path=split.path, query=parse_qs(split.query, keep_blank_values=True),
                    headers={k.lower(): v for k, v in self.headers.items()}, body=body,
                    arrived_at=time.monotonic(), status=step.status))
                if step.hang_s > 0:
                    receiver._stopping.wait(step.hang_s)
                try:
                    self.send_response(step.status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(receiver.response_body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(receiver.response_body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timed out) while we hung: expected in hang tests

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass  # keep pytest output clean; the requests are recorded instead

        return Handler
