"""The HTTP server of the metrics port: HTTP/1.1 with keep-alive, TLS from the web config, a bounded
number of connections, and deadlines on every request.

One thread holds every connection that is not being answered, in an epoll selector: it accepts, runs TLS
handshakes and reads request heads without blocking, doing a bounded amount of work per connection per
wake-up (one handshake step or one read of READ_SIZE), so no client, however fast it sends, keeps it from
the others. A complete head goes to a worker thread (started on demand, at most one per connection), which
answers it (surfaces/pages.py) and writes the answer within the request's deadline, then gives the
connection back; nothing past that head is read before it is answered. So a client that connects and says
nothing, drips its request a byte at a time, or streams without end, costs a buffer of at most MAX_HEAD +
READ_SIZE and a slot, never a thread, and only until its deadline. A head over MAX_HEAD is answered 431.

The limits:
- At most `max_connections` open, and at most half of them new (no request answered yet). Beyond that,
  new connections wait in the kernel's listen queue: a flood of silent or slow clients can neither take
  the connection an authorised client holds (Prometheus keeps its connection from scrape to scrape) nor
  the file descriptors that cleanup, the /proc scans and the state database need.
- When the cap is reached and a new connection may come in, the longest-idle kept-alive connection is
  closed for it; its client reconnects (Go's HTTP client retries a request on a kept connection that the
  server closed while idle).
- The kernel hands over a connection only once it has sent something (TCP_DEFER_ACCEPT, up to the head
  deadline): a client that connects and says nothing waits in the kernel, costing no file descriptor, and
  one handed over silent after that has had its time.
- When the new connections fill their half and another waits in the listen queue, a new one is closed for
  it: one handed over silent at once, else the oldest that has had YIELD_AFTER to send its request (TLS
  handshake included) and has not. A real client sends its request as soon as it connects; slow TLS
  handshakes and silent connections cannot keep Prometheus' new connection waiting.
- A request's head must be complete within `head_deadline` of its first byte (of the accept, for a new
  connection: the TLS handshake counts), and its answer written within `request_deadline` of the same
  start, however slowly the client sends or reads. A kept-alive connection idle for `idle_timeout` is closed.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from trainguard.surfaces.access import Access
from trainguard.surfaces.pages import answer, refusal

log = logging.getLogger(__name__)

HEAD_DEADLINE = 5.0
REQUEST_DEADLINE = 30.0
# Longer than any usual scrape interval, so Prometheus' connection lives from scrape to scrape.
IDLE_TIMEOUT = 120.0
# A loopback or LAN client completes its TLS handshake and request in a few ms; a WAN one in a few RTTs.
YIELD_AFTER = 0.25
MAX_HEAD = 32 * 1024  # request line and headers; Prometheus sends ~250 bytes
READ_SIZE = 16 * 1024  # one read per connection per wake-up: a TLS record's worth
ACCEPTS = 16  # connections accepted per wake-up at most: the others' reads come between
BACKLOG = 1024  # connections the kernel holds (deferred ones included) cost no file descriptor
MAX_WORKERS = 1024  # the bound of metrics.max_connections; threads only start as connections need them
_LISTENER, _WAKE = object(), object()


class Connection:
    __slots__ = ("accepted", "answered", "buffer", "busy", "handshaking", "heard", "last", "peer", "sock", "started")

    def __init__(self, sock: socket.socket, peer: object, now: float):
        self.sock, self.peer = sock, peer
        self.buffer = b""
        self.accepted = now
        self.heard = False  # it has sent something (a byte of a handshake or a request)
        self.started: float | None = now  # when the request being read began; None between requests
        self.last = now  # when the last answer was written
        self.answered = 0
        self.busy = False  # a worker has it
        self.handshaking = isinstance(sock, ssl.SSLSocket)


class HttpServer:
    def __init__(self, host: str, port: int, app: Callable, access: Access | None = None, max_connections: int = 16,
                 *, head_deadline: float = HEAD_DEADLINE, request_deadline: float = REQUEST_DEADLINE,
                 idle_timeout: float = IDLE_TIMEOUT):
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, round(head_deadline)))
            self.listener.bind((sockaddr[0], port))
            self.listener.listen(BACKLOG)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.app, self.access, self.max_connections = app, access or Access(), max_connections
        self.head_deadline, self.request_deadline, self.idle_timeout = head_deadline, request_deadline, idle_timeout
        self._conns: set[Connection] = set()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._listening = False
        self._paused_until = 0.0  # accept() ran out of file descriptors: wait a little
        self._returned: deque[tuple[Connection, bool]] = deque()  # from the workers
        self._lock = threading.RLock()
        self._closed = False
        self._stopping = False
        self._workers = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="metrics-http-answer")
        self.thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def start(self) -> None:
        self.thread.start()

    def configure(self, access: Access, max_connections: int) -> None:
        """New settings (SIGHUP): new connections get the new TLS context, every next request the new users."""
        self.access, self.max_connections = access, max_connections
        self._wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the port and every connection (an idle kept-alive one included): no more answers."""
        self._stopping = True
        if self.thread.is_alive():
            self._wake()
            self.thread.join(timeout)
        else:
            self._close_all()
        self._workers.shutdown(wait=False)

    def _wake(self) -> None:
        with self._lock:
            if self._closed:  # its pipe is closed, and the number may be another file's by now
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # a wake-up is already pending

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._listen(self._can_accept())
                deadline = self._next_deadline()
                timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                for key, _events in self._selector.select(timeout):
                    if key.data is _LISTENER:
                        self._accept()
                    elif key.data is _WAKE:
                        while os.read(self._wake_r, 4096) == 4096:
                            pass
                    elif key.data in self._conns:
                        self._read(key.data)
                self._take_back()
                self._expire()
        except Exception:  # a bug here must not leave the port open and dead
            log.exception("the metrics HTTP server failed")
        finally:
            self._close_all()

    def _can_accept(self) -> bool:
        if self._stopping or time.monotonic() < self._paused_until:
            return False
        return self._room(time.monotonic(), make=False)

    def _room(self, now: float, make: bool) -> bool:
        """Whether one more connection may come in; with `make`, close the one it takes the place of."""
        new = [c for c in self._conns if not c.answered]
        if len(new) >= (self.max_connections + 1) // 2:
            victim = _yielding(new, now)
        elif len(self._conns) < self.max_connections:
            return True
        else:
            victim = min(filter(_idle, self._conns), key=lambda c: c.last, default=None)
        if victim is not None and make:
            self._close(victim)
        return victim is not None

    def _listen(self, want: bool) -> None:
        if want and not self._listening:
            self._selector.register(self.listener, selectors.EVENT_READ, _LISTENER)
        elif self._listening and not want:
            self._selector.unregister(self.listener)
        self._listening = want

    def _accept(self) -> None:
        for _ in range(ACCEPTS):
            if not self._can_accept():
                return
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("metrics port: cannot accept a connection: %s; trying again in a second", exc.strerror)
                    self._paused_until = time.monotonic() + 1.0
                return
            self._room(time.monotonic(), make=True)
            sock.setblocking(False)
            heard = _has_data(sock)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = self.access.context
            if context is not None:
                try:
                    sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = Connection(sock, peer, time.monotonic())
            conn.heard = heard
            self._conns.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Connection) -> None:
        """Its socket is readable: one handshake step, or one read and a request handed over if complete."""
        conn.heard = True
        if conn.handshaking:
            try:
                conn.sock.do_handshake()  # type: ignore[attr-defined]
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:  # no client certificate, an untrusted one, not TLS at all ...
                log.debug("TLS handshake with %s failed: %s", conn.peer, exc)
                return self._close(conn)
            conn.handshaking = False
            if not self.access.peer_allowed(conn.sock):  # type: ignore[arg-type]
                log.debug("client certificate of %s names none of client_allowed_sans", conn.peer)
                return self._close(conn)
        try:
            data = conn.sock.recv(READ_SIZE)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            return self._close(conn)
        if not data:
            return self._close(conn)
        if conn.started is None:
            conn.started = time.monotonic()
        conn.buffer += data
        self._dispatch(conn)

    def _dispatch(self, conn: Connection) -> None:
        """A complete head in its buffer goes to a worker; one over MAX_HEAD is refused (431)."""
        end = _head_end(conn.buffer[:MAX_HEAD + 4])
        if end < 0 and len(conn.buffer) <= MAX_HEAD:
            return
        head: bytes | None = None
        if end >= 0:
            head, conn.buffer = conn.buffer[:end], conn.buffer[end:]
        else:
            conn.buffer = b""
        conn.busy = True
        self._selector.unregister(conn.sock)
        self._workers.submit(self._answer, conn, head)

    def _answer(self, conn: Connection, head: bytes | None) -> None:
        """On a worker thread: answer one request (None: a head over MAX_HEAD) and write it before its deadline."""
        keep = False
        try:
            if head is None:
                response = refusal("431 Request Header Fields Too Large", self.access)
            else:
                response, keep = answer(head, self.app, self.access)
            _send_all(conn.sock, response, (conn.started or time.monotonic()) + self.request_deadline)
        except OSError:  # the client went away, or did not read the answer in time
            keep = False
        except Exception:
            log.exception("answering %s failed", conn.peer)
            keep = False
        finally:
            with self._lock:
                if not self._closed:
                    self._returned.append((conn, keep))
                    self._wake()
                    return
            conn.sock.close()

    def _take_back(self) -> None:
        while self._returned:
            conn, keep = self._returned.popleft()
            conn.busy = False
            if not keep or conn not in self._conns:
                self._close(conn)
                continue
            conn.answered += 1
            conn.last = time.monotonic()
            conn.started = conn.last if conn.buffer else None  # a pipelined request has begun
            conn.sock.setblocking(False)
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._dispatch(conn)  # a pipelined request already read

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns if not c.busy and self._deadline(c) <= now]:
            self._close(conn)

    def _deadline(self, conn: Connection) -> float:
        if conn.started is not None:
            return conn.started + self.head_deadline
        return conn.last + self.idle_timeout

    def _next_deadline(self) -> float | None:
        now = time.monotonic()
        deadlines = [self._deadline(c) for c in self._conns if not c.busy]
        # when a new connection may yield its place: the listener is watched again then
        deadlines += [y for c in self._conns if not c.answered and (y := c.accepted + YIELD_AFTER) > now]
        if self._paused_until > time.monotonic():
            deadlines.append(self._paused_until)
        return min(deadlines, default=None)

    def _close(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if conn.busy:  # its worker gives it back, or closes it once the server is closed
            _shutdown(conn.sock)
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _close_all(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for conn in list(self._conns):
            _shutdown(conn.sock)  # a client waiting on an idle keep-alive connection sees it end now
            self._close(conn)
        for conn, _keep in self._returned:
            conn.sock.close()
        self._returned.clear()
        self._selector.close()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _yielding(new: list[Connection], now: float) -> Connection | None:
    """The new connection to close for one waiting: a silent one (the kernel held it for the deferral, see
    the listener), else the oldest past YIELD_AFTER without a request; None when none may go."""
    late = [c for c in new if not c.busy and (not c.heard or now - c.accepted >= YIELD_AFTER)]
    return min(late, key=lambda c: (c.heard, c.accepted), default=None)


def _has_data(sock: socket.socket) -> bool:
    try:
        sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        pass  # reset already: its read closes it
    return True


def _idle(conn: Connection) -> bool:
    """A kept-alive connection between requests: the one to close when a new one needs its slot."""
    return conn.answered > 0 and not conn.busy and conn.started is None


def _head_end(buffer: bytes) -> int:
    """Where the request head ends (after its blank line), or -1 while it has not arrived."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := buffer.find(sep)) >= 0]
    return min(ends, default=-1)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("answer not read before the request deadline")
        sock.settimeout(left)
        view = view[sock.send(view):]


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
