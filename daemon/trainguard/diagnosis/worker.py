"""Slow diagnosis work off the daemon's cycle thread: one job per key, a bounded number of threads.

A /proc read can block (maps and cmdline wait for the target's memory lock, which a thread
faulting on a hung share holds), and py-spy takes seconds: the cycle hands such work to a
job here and waits for it only up to a deadline. There is at most one job per key (per GPU,
plus the placement scan), so the threads are bounded by the keys. A job that overruns keeps
its thread (a read stuck in the kernel cannot be cancelled); once `limit` jobs have run longer
than `stuck_after`, new work is refused rather than piling up threads on a wedged /proc.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)


class Job:
    def __init__(self, key: Hashable, fn: Callable[[], Any], tag: Any, started: float):
        self.key = key
        self.fn = fn
        self.tag = tag  # what the caller wants back with the result (e.g. the time it was asked for)
        self.started = started  # monotonic
        self.result: Any = None
        self.error: str | None = None
        self.finished = threading.Event()

    @property
    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self, timeout: float) -> bool:
        return self.finished.wait(max(timeout, 0.0))

    def run(self) -> None:
        try:
            self.result = self.fn()
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis is reported, never kills the daemon
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("diagnosis job %s failed", self.key)
        finally:
            self.finished.set()


class BoundedWorker:
    def __init__(self, limit: int = 2, stuck_after: float = 30.0, monotonic: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.stuck_after = stuck_after
        self.monotonic = monotonic
        self._jobs: dict[Hashable, Job] = {}
        self._lock = threading.Lock()

    def latest(self, key: Hashable) -> Job | None:
        with self._lock:
            return self._jobs.get(key)

    def stuck(self) -> int:
        """Jobs running longer than stuck_after."""
        now = self.monotonic()
        with self._lock:
            return sum(1 for j in self._jobs.values() if not j.done and now - j.started > self.stuck_after)

    def submit(self, key: Hashable, fn: Callable[[], Any], tag: Any = None) -> Job | None:
        """The job for key: the one in flight, else a new one started now; None while `limit` jobs are stuck."""
        if self.stuck() >= self.limit:
            return None
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.done:
                return job
            job = Job(key, fn, tag, self.monotonic())
            self._jobs[key] = job
        threading.Thread(target=job.run, name=f"trainguard-diagnosis:{key}", daemon=True).start()
        return job


class Children:
    """Child processes a job runs (py-spy), killed and reaped at their timeout or at kill_all()."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()

    def run(self, argv: list[str], timeout: float) -> tuple[int, str] | None:
        """(exit status, stdout), or None when it could not start or ran past timeout."""
        try:
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return None
        with self._lock:
            self._running.add(child)
        try:
            out, _ = child.communicate(timeout=max(timeout, 0.0))
            return child.returncode, out
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return None
        finally:
            with self._lock:
                self._running.discard(child)

    def kill_all(self) -> None:
        with self._lock:
            running = list(self._running)
        for child in running:
            child.kill()
            child.wait()
