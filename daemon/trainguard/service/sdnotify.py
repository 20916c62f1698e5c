"""sd_notify(3) in a few lines: tell systemd we are ready, alive, reloading or stopping.

systemd passes an AF_UNIX datagram socket in $NOTIFY_SOCKET (a path, or "@name"
for the abstract namespace). Each message is newline-separated KEY=VALUE lines.
Outside systemd (no $NOTIFY_SOCKET) every call is a no-op, so the daemon runs the
same under a terminal, a container or a test.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Mapping

log = logging.getLogger(__name__)


class SdNotifier:
    def __init__(self, environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]  # abstract namespace
        self.address = address
        self.watchdog_s = _watchdog_seconds(environ)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, **fields: str | int) -> bool:
        """send(READY=1, STATUS="...") -> one datagram; False when there is no socket or it failed."""
        if not self.address:
            return False
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self.address)
            return True
        except OSError as exc:
            if not self._warned:  # a broken socket must not flood the log every cycle
                log.warning("sd_notify to %r failed: %s", self.address.replace("\0", "@"), exc)
                self._warned = True
            return False

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def watchdog(self, status: str) -> bool:
        return self.send(WATCHDOG=1, STATUS=status)

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match this to the reload request.
        return self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> bool:
        return self.send(STOPPING=1, STATUS="stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_seconds(environ: Mapping[str, str]) -> float | None:
    """WatchdogSec as systemd passed it; None when the watchdog is off or meant for another process."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 1e6
