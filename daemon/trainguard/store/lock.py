"""One writer per state directory: an exclusive flock on a lock file that holds the writer's PID.

Two daemons on one state directory would send every alert twice. `trainguard run` takes
the lock for as long as it runs; the kernel drops it when the process ends, however it
ends (no stale lock after a kill -9 or a container restart). Readers (status, health,
diagnose, cleanup --dry-run) never take it: they ask holder() who has it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from dataclasses import dataclass

LOCK_NAME = "trainguard.pid"

log = logging.getLogger(__name__)


class LockHeld(Exception):
    """Another process holds the state directory's lock."""

    def __init__(self, path: str, pid: int | None):
        self.path = path
        self.pid = pid
        who = f"PID {pid}" if pid else "another process"
        super().__init__(f"{who} already runs trainguard on this state directory (lock {path}); "
                         "stop it first, or give this one its own --state-dir")


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, LOCK_NAME)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


class StateLock:
    """The lock of one state directory, held from acquire() until release() or process exit."""

    def __init__(self, state_dir: str):
        self.path = lock_path(state_dir)
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0) -> None:
        """Take the lock (retrying for up to `wait` s: a `status` peeking at it holds it for microseconds)
        and write our PID into the file. Raises LockHeld naming the holder's PID."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    pid = _read_pid(fd)
                    os.close(fd)
                    if exc.errno in (errno.EAGAIN, errno.EACCES):
                        raise LockHeld(self.path, pid) from None
                    raise
                time.sleep(0.05)
        self.fd = fd
        data = f"{os.getpid()}\n".encode()
        try:
            # Over the old PID, then cut: no new block is needed, so a restart on a full disk still works.
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError as exc:  # the lock holds all the same; only readers lose the PID
            log.warning("holding the lock %s but cannot write our PID into it: %s", self.path,
                        exc.strerror or exc)

    def release(self) -> None:
        if self.fd is None:
            return
        # The PID stays in the file: readers see an unlocked file naming the daemon that stopped.
        os.close(self.fd)  # closing the only descriptor drops the flock
        self.fd = None


@dataclass(frozen=True, slots=True)
class Holder:
    running: bool | None  # a process holds the lock now; None: we may not look (a non-root reader)
    pid: int | None     # the PID written in the lock file (the holder's, or the last one's)


def holder(state_dir: str) -> Holder:
    """Whether a daemon holds this state directory, without disturbing it (read-only callers)."""
    try:
        fd = os.open(lock_path(state_dir), os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError:
        return Holder(None, None)
    except OSError:
        return Holder(False, None)
    try:
        pid = _read_pid(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return Holder(True, pid)
            return Holder(False, pid)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return Holder(False, pid)
    finally:
        os.close(fd)
