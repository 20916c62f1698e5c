"""The threads that run statfs probes for the filesystem sampler (sources.fs), so that a hung mount
never blocks a cycle.

Healthy local mounts are probed one after another by one shared thread, the batch: one wake-up per
cycle for all of them. A thread per mount, each woken every cycle, cost 30 thread hand-offs per
cycle with 30 mounts, more CPU than the statfs calls themselves. A mount that may hang (network,
FUSE) has its own thread from the start, and so does a local mount the batch was found stuck on:
the stuck batch is left to that mount (it stops after its current probe), the mounts it had not
reached go to a new batch, and the slow mount keeps its own thread from then on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from trainguard.records import FsUsage, Mount

IDLE_EXIT = 60.0  # a probe thread with nothing asked of it for this long ends (its mounts went away)


@dataclass
class ProbeResult:
    usage: FsUsage | None
    error: str | None
    missing: tuple[str, ...]


ProbeFn = Callable[[Mount, Sequence[str]], ProbeResult]


class Round:
    """One cycle's requests: the cycle waits on `finished` until `left` reaches 0 (or its deadline)."""

    def __init__(self, finished: threading.Condition, left: int):
        self.finished = finished
        self.left = left

    def answered(self, count: int = 1) -> None:
        with self.finished:
            self.left -= count
            if self.left <= 0:  # the cycle wakes once, when the last of its probes is in
                self.finished.notify_all()


def _run(probe_fn: ProbeFn, mount: Mount, paths: Sequence[str]) -> ProbeResult:
    try:
        return probe_fn(mount, paths)
    except Exception as exc:  # noqa: BLE001 - anything else must not leave the probe "busy" forever
        return ProbeResult(None, f"{type(exc).__name__}: {exc}", ())


class MountProbe:
    """One mount's probe state: asked when, last answer. Run by the batch, or by its own thread (`kick`),
    which waits between cycles for the next request. A new request is never made while one is running
    (no pile-up behind a hung mount)."""

    def __init__(self, mount: Mount, probe_fn: ProbeFn):
        self.mount = mount
        self.probe_fn = probe_fn
        self.thread: threading.Thread | None = None
        self.started_mono = 0.0
        self.started_wall = 0.0
        self.last: ProbeResult | None = None
        # Requests made and answered, counted: busy while they differ. (An Event per request was a
        # tenth of the probing's CPU.)
        self.asked = 0
        self.answered = 0
        self._go = threading.Event()
        self._job: tuple | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self.asked != self.answered

    def ask(self, mono: float, wall: float) -> int:
        """A new request (its number): this probe is busy until answer(number)."""
        self.started_mono, self.started_wall = mono, wall
        self.asked += 1
        return self.asked

    def answer(self, result: ProbeResult, number: int) -> None:
        self.last = result
        self.answered = number

    def kick(self, mono: float, wall: float, paths: Sequence[str], round_: Round) -> bool:
        """Ask its own thread for a probe unless one is still running; True when one was asked for."""
        if self.busy:
            return False  # still stuck in the kernel: never stack a second request on it
        number = self.ask(mono, wall)
        with self._lock:
            self._job = (tuple(paths), number, round_)
            self._go.set()
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name=f"probe:{self.mount.mount_point}",
                                               daemon=True)
                self.thread.start()
        return True

    def _serve(self) -> None:
        while True:
            self._go.wait(IDLE_EXIT)
            with self._lock:
                if not self._go.is_set():
                    self.thread = None  # idle: a mount that is no longer watched; a new request starts one
                    return
                self._go.clear()
                paths, number, round_ = self._job
            self.answer(_run(self.probe_fn, self.mount, paths), number)
            round_.answered()


class Batch:
    """One thread that probes many mounts in turn, once per request."""

    def __init__(self, clock: Callable[[], tuple[float, float]]):
        self.clock = clock  # (monotonic, wall) now: each probe is stamped when the thread reaches it
        self.thread: threading.Thread | None = None
        self.current: MountProbe | None = None  # the probe the thread is in now
        self.running = False  # a request is being worked through
        self._abandoned = False
        self._go = threading.Event()
        self._job: tuple | None = None
        self._lock = threading.Lock()

    def kick(self, jobs: Sequence[tuple[MountProbe, Sequence[str]]], mono: float, wall: float,
             round_: Round) -> None:
        asked = [(probe, tuple(paths), probe.ask(mono, wall)) for probe, paths in jobs]
        with self._lock:
            self._job = (asked, round_)
            self.running = True
            self._go.set()
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="probe:batch", daemon=True)
                self.thread.start()

    def abandon(self) -> MountProbe | None:
        """Leave the thread to the probe it is stuck in (returned); it takes no further probe."""
        with self._lock:
            self._abandoned = True
            return self.current

    def _serve(self) -> None:
        while True:
            self._go.wait(IDLE_EXIT)
            with self._lock:
                if not self._go.is_set() or self._abandoned:
                    self.thread = None
                    return
                self._go.clear()
                jobs, round_ = self._job
            for probe, paths, number in jobs:
                with self._lock:
                    if self._abandoned:
                        return  # the mounts not reached were asked again of a new batch
                    self.current = probe
                probe.started_mono, probe.started_wall = self.clock()
                probe.answer(_run(probe.probe_fn, probe.mount, paths), number)
            with self._lock:
                self.current = None
                self.running = False
            round_.answered(len(jobs))  # one wake-up for the cycle, when all are in
