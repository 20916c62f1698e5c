"""One mirror round: plan on this thread, copy in a child process, kill the child when a file stops moving.

The supervisor only reads the child's report lines (with a short poll), so it never waits on the
share itself: a share that hangs costs one `file_timeout`, then the child is killed (SIGKILL) and
the round ends with the reason. The kernel may not let it go at once (a FUSE request the server
already holds is waited out even after SIGKILL): such a child is kept and polled, and no second
copier starts for this mirror until it is gone, so a hung share never piles up copiers.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Callable

from trainguard.actions.mirror.globs import Matcher
from trainguard.actions.mirror.plan import Job, plan, walk
from trainguard.actions.mirror.record import Copied, Record
from trainguard.clock import Clock, SystemClock
from trainguard.config import Mirror
from trainguard.records import MirrorState
from trainguard.units import format_duration

COPIER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "copier.py")
FLUSH_EVERY = 1.0  # seconds between writes of the copier's reports to the state db
KILL_WAIT = 1.0  # seconds a killed copier gets to exit before it is kept as stuck

# errno -> (reason kind, words); anything else is an "error" named by its strerror.
REASONS = {
    errno.ENOSPC: ("full", "dest full (ENOSPC)"),
    errno.EDQUOT: ("full", "dest quota exceeded (EDQUOT)"),
    errno.EACCES: ("permission", "permission denied on dest (EACCES)"),
    errno.EPERM: ("permission", "operation not permitted on dest (EPERM)"),
    errno.EROFS: ("permission", "dest is read-only (EROFS)"),
    errno.ENOTCONN: ("unresponsive", "dest unresponsive: its filesystem is disconnected (ENOTCONN)"),
    errno.ESTALE: ("unresponsive", "dest unresponsive: stale file handle (ESTALE)"),
    errno.ETIMEDOUT: ("unresponsive", "dest unresponsive: timed out (ETIMEDOUT)"),
}
_RANK = {"": 0, "changing": 1, "error": 2, "permission": 3, "full": 4, "unresponsive": 5}


@dataclass
class _Round:
    """What one copier run did, as its report lines said."""

    pending: dict[bytes, Job]
    kind: str = ""
    reason: str = ""
    op: str = "start"
    path: str = ""
    moved: int = 0

    def problem(self, kind: str, reason: str) -> None:
        if _RANK[kind] > _RANK[self.kind]:
            self.kind, self.reason = kind, reason


@dataclass
class MirrorRunner:
    mirror: Mirror
    record: Record
    clock: Clock = field(default_factory=SystemClock)
    python: str = sys.executable
    poll: float = 0.2  # seconds between checks of a quiet copier
    stuck: subprocess.Popen | None = None  # a killed copier the kernel still holds
    activity: tuple[str, str] = ("", "")  # the copier's last reported operation on the share, and its path
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def open(cls, mirror: Mirror, conn, clock: Clock | None = None, **kw) -> "MirrorRunner":
        clock = clock or SystemClock()
        return cls(mirror, Record(conn, mirror.name, mirror.dest, clock.time()), clock, **kw)

    def stop(self) -> None:
        """Ends a running round soon (its copier is killed)."""
        self._stop.set()

    def run(self, dest_problem: str = "", on_plan: Callable[[MirrorState], None] | None = None) -> MirrorState:
        """One round. dest_problem: why the share is known to be unusable now (its probe hangs); "" if not."""
        m, now = self.mirror, self.clock.time()
        try:
            files, problems = walk(m.source, Matcher(m.patterns, m.exclude))
        except OSError as exc:  # nothing planned: the changes pending since the last round still wait
            stored = self.record.states()[0]
            return self.record.finish(replace(stored, ts=now, reason_kind="error",
                                              reason=f"source {m.source} unreadable: {exc.strerror}"))
        entries = self.record.entries()
        p = plan(files, entries, now, self.record.created)
        self.record.forget(p.gone)
        self.record.mark_dirty([(j.rel, j.dirty_since) for j in p.jobs
                                if entries.get(j.rel) is None or entries[j.rel].dirty_since is None])
        rnd = _Round({j.rel: j for j in p.jobs})
        planned = self.record.pending(self._state(rnd, with_reason=False))  # `status` sees a round that hangs
        if on_plan is not None:
            on_plan(planned)
        if self.stuck is not None and not self._reaped(self.stuck):
            rnd.problem("unresponsive", f"dest unresponsive: the copier killed earlier (pid {self.stuck.pid}) "
                                        "is still stuck in the kernel")
        elif dest_problem:
            rnd.problem("unresponsive", dest_problem)
        else:
            self.stuck = None
            temps = self.record.temps()
            if rnd.pending or temps:
                self._copy(rnd, temps)
        if problems:
            rnd.problem("error", f"cannot read {problems[0]}")
        return self.record.finish(self._state(rnd))

    def _state(self, rnd: _Round, *, with_reason: bool = True) -> MirrorState:
        """The stored state (totals, last_ok) with this round's pending files and, optionally, its reason."""
        jobs = rnd.pending.values()
        now = dict(ts=self.clock.time(), oldest_pending=min((j.dirty_since for j in jobs), default=None),
                   pending_files=len(rnd.pending), pending_bytes=sum(j.size for j in jobs), dest=self.mirror.dest)
        if with_reason:
            now.update(reason=rnd.reason, reason_kind=rnd.kind)
        return replace(self.record.states()[0], **now)

    def _spawn(self) -> subprocess.Popen:
        # The copier is a standard-library script: -S skips site hooks (.pth files), which cost more than
        # the copy of a small file, and no package needs importing.
        return subprocess.Popen([self.python, "-S", COPIER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd="/", start_new_session=True)

    def _copy(self, rnd: _Round, temps: list[bytes]) -> None:
        jobs = [{"rel": os.fsdecode(j.rel)} for j in rnd.pending.values()]
        request = {"source": self.mirror.source, "dest": self.mirror.dest, "jobs": jobs,
                   "temps": [os.fsdecode(t) for t in temps]}
        proc = self._spawn()
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            errors = self._supervise(proc, rnd)
        except BaseException:  # a supervisor bug must not leave a copier running on its own
            self._kill(proc)
            raise
        if proc.returncode not in (0, None) and proc.returncode != -signal.SIGKILL and not rnd.reason:
            rnd.problem("error", f"copier exited with {proc.returncode}: {errors.strip()[-300:]}")

    def _supervise(self, proc: subprocess.Popen, rnd: _Round) -> str:
        sel = selectors.DefaultSelector()
        err_fd = proc.stderr.fileno()
        buffers = {proc.stdout.fileno(): b"", err_fd: b""}
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream.fileno(), selectors.EVENT_READ)
        last = flushed = self.clock.monotonic()
        timeout = self.mirror.file_timeout
        try:
            while sel.get_map():
                for key, _ in sel.select(self.poll):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        sel.unregister(key.fd)
                        continue
                    last = self.clock.monotonic()
                    if key.fd == err_fd:
                        buffers[key.fd] = (buffers[key.fd] + data)[-4096:]
                        continue
                    *lines, buffers[key.fd] = (buffers[key.fd] + data).split(b"\n")
                    for line in lines:
                        self._event(json.loads(line), rnd)
                if last - flushed >= FLUSH_EVERY:
                    self.record.flush()
                    flushed = last
                if self._stop.is_set():
                    self._kill(proc)
                    rnd.problem("error", "stopped before the copy finished")
                    break
                if self.clock.monotonic() - last >= timeout:
                    self._kill(proc)
                    self.record.error()
                    rnd.problem("unresponsive", f"dest unresponsive: {rnd.op} {rnd.path} made no progress for "
                                                f"{format_duration(timeout)}")
                    break
        finally:
            self.record.flush()
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        if proc.poll() is None and self.stuck is not proc:
            proc.wait()
        return buffers[err_fd].decode(errors="replace")

    @staticmethod
    def _reaped(proc: subprocess.Popen) -> bool:
        """A killed copier leaves once the share answers the request it sits in (FUSE waits it out)."""
        try:
            proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _kill(self, proc: subprocess.Popen) -> None:
        proc.kill()
        try:
            proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            self.stuck = proc

    def _event(self, ev: dict, rnd: _Round) -> None:
        kind = ev["ev"]
        if kind == "op":
            rnd.op, rnd.path = ev["op"], ev["path"]
            self.activity = (rnd.op, rnd.path)
        elif kind == "tmp":
            self.record.temp_created(os.fsencode(ev["tmp"]))
        elif kind == "temp_gone":
            self.record.temp_gone(os.fsencode(ev["tmp"]))
        elif kind == "done":
            rel = os.fsencode(ev["rel"])
            rnd.pending.pop(rel)
            self.record.copied(rel, Copied(ev["size"], ev["mtime_ns"], ev["digest"]), ev["size"])
            rnd.op = "done"
        elif kind == "vanished":
            rel = os.fsencode(ev["rel"])
            rnd.pending.pop(rel, None)
            self.record.forget([rel])
        elif kind == "changed":
            rnd.problem("changing", f"{ev['rel']} changed while it was copied; next round copies it again")
        elif kind == "fail":
            self.record.error()
            code = ev.get("errno")
            kind_, words = REASONS.get(code, ("error", f"{ev['error']}"))
            rnd.problem(kind_, f"{words}: {ev.get('path') or ev['rel']}")
