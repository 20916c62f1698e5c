"""The daemon's mirror threads: one per mirror, each running rounds on its `every` schedule.

The cycle hands over each snapshot (submit) and reads the latest states (states); neither waits for
a round, a walk or a copier. A round skips the copy while the dest's mount probe hangs.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

from trainguard.actions.mirror.probe import unresponsive
from trainguard.actions.mirror.record import read_states
from trainguard.actions.mirror.runner import MirrorRunner
from trainguard.clock import Clock
from trainguard.config import Mirror
from trainguard.records import MirrorState, Snapshot

log = logging.getLogger(__name__)


def dest_problem(snapshot: Snapshot | None, dest: str, now: float) -> str:
    """Why the dest is known to hang from the daemon's own mount probes; "" when it is not (or not watched)."""
    return unresponsive(snapshot.filesystems, dest, now) if snapshot is not None else ""


class MirrorWorker:
    def __init__(self, mirrors: Sequence[Mirror], connect: Callable[[], object], clock: Clock, *,
                 poll: float = 0.5):
        self.mirrors = list(mirrors)
        self._connect = connect
        self._clock = clock
        self._poll = poll
        self._lock = threading.Lock()
        self._round_done = threading.Condition(self._lock)
        self._rounds = {m.name: 0 for m in self.mirrors}
        self._snapshot: Snapshot | None = None
        self._stop = threading.Event()
        self._kicks = {m.name: threading.Event() for m in self.mirrors}
        self._runners: dict[str, MirrorRunner] = {}
        conn = connect()
        try:  # a restarted daemon knows at once what is still waiting
            self._states = {s.name: s for s in read_states(conn, self._kicks)}
        finally:
            conn.close()
        self._threads = [threading.Thread(target=self._loop, args=(m,), name=f"trainguard-mirror-{m.name}",
                                          daemon=True) for m in self.mirrors]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def states(self) -> tuple[MirrorState, ...]:
        with self._lock:
            return tuple(self._states[m.name] for m in self.mirrors if m.name in self._states)

    def kick(self, name: str | None = None) -> None:
        """Run a round now (name None: every mirror)."""
        for n, event in self._kicks.items():
            if name is None or n == name:
                event.set()

    def activity(self, name: str) -> tuple[str, str]:
        """The named mirror's last operation on the share and its path, ("", "") before any."""
        with self._lock:
            runner = self._runners.get(name)
        return runner.activity if runner is not None else ("", "")

    def rounds(self, name: str) -> int:
        """Rounds the named mirror has finished since start."""
        with self._lock:
            return self._rounds[name]

    def wait_rounds(self, name: str, count: int, timeout: float) -> bool:
        """Wait until the named mirror has finished `count` rounds; False on timeout."""
        with self._round_done:
            return self._round_done.wait_for(lambda: self._rounds[name] >= count, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            for runner in self._runners.values():
                runner.stop()
        for event in self._kicks.values():
            event.set()
        for t in self._threads:
            t.join(timeout)

    def _publish(self, state: MirrorState, *, done: bool = False) -> None:
        with self._lock:
            self._states[state.name] = state
            if done:
                self._rounds[state.name] += 1
                self._round_done.notify_all()

    def _loop(self, mirror: Mirror) -> None:
        conn = self._connect()
        runner = MirrorRunner.open(mirror, conn, self._clock)
        with self._lock:
            self._runners[mirror.name] = runner
        kick = self._kicks[mirror.name]
        due = self._clock.monotonic()
        try:
            while not self._stop.is_set():
                if kick.is_set() or self._clock.monotonic() >= due:
                    kick.clear()
                    with self._lock:
                        snapshot = self._snapshot
                    try:
                        self._publish(runner.run(dest_problem(snapshot, mirror.dest, self._clock.time()),
                                                 on_plan=self._publish), done=True)
                    except Exception:  # one broken round must not end the mirror
                        log.exception("mirror %s failed", mirror.name)
                    due = self._clock.monotonic() + mirror.every
                kick.wait(self._poll)
        finally:
            conn.close()
