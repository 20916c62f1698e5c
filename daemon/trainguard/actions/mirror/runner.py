"""One mirror round: plan on this thread, copy in a child process, kill the child when a file stops moving.

The supervisor only reads the child's report lines (with a short poll), so it never waits on the
share itself: a share that hangs costs one `meta_timeout` (a mkdir, create, rename that does not
return) or `file_timeout` (a write or fsync that moves nothing), then the child is killed (SIGKILL)
and the round ends with the reason. The kernel may not let it go at once (a FUSE request the server
already holds is waited out even after SIGKILL): such a child is kept, recorded as stuck (PID,
operation, path) and polled. Every copier is recorded in the state db while it lives, and no
process (this one, a reloaded or restarted daemon, `trainguard mirror`) starts a second one for the
mirror until it is gone, so a hung share never piles up copiers.
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
EXIT_WAIT = 10.0  # seconds a copier that closed its output gets to exit before it is killed

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
# Operations that answer at once from a live share: no progress on one for `meta_timeout` is a hang.
# write and fsync move data and may take long on a slow share: they get `file_timeout`.
META_OPS = frozenset({"mkdir", "create", "rename", "unlink", "utime"})
FINISHING = frozenset({"done", "fail", "changed", "vanished", "temp_gone", "ready"})  # end a thread's operation
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
    ops: dict = field(default_factory=dict)  # copy thread -> (operation, path) it has started and not finished

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
        busy = self._copier_busy()
        if busy:
            rnd.problem(*busy)
        elif dest_problem:
            rnd.problem("unresponsive", dest_problem)
        elif self._stop.is_set():
            rnd.problem("error", "stopped before the copy started")
        else:
            temps = self.record.temps()
            if rnd.pending or temps:
                self._copy(rnd, temps)
        if problems:
            rnd.problem("error", f"cannot read {problems[0]}")
        return self.record.finish(self._state(rnd))

    def _copier_busy(self) -> tuple[str, str] | None:
        """(kind, reason) when a copier of this mirror is still alive: the one this runner killed and the
        kernel keeps, or one another process started (a daemon before its reload or restart, the command)."""
        if self.stuck is not None and self._reaped(self.stuck):
            self.stuck = None
        row = self.record.copier()
        if row is not None and self.stuck is None and not row.alive():
            self.record.copier_gone()
            row = None
        if row is None:
            return None if self.stuck is None else ("unresponsive", stuck_reason(self.stuck.pid, "", "", 0.0))
        if row.stuck_since is None:
            return "error", f"another copy to {self.mirror.dest} is under way (copier pid {row.pid}, of another process)"
        return "unresponsive", stuck_reason(row.pid, row.op, row.path, self.clock.time() - row.stuck_since)

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
        self.record.copier_started(proc.pid)
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            errors = self._supervise(proc, rnd)
        except BaseException:  # a supervisor bug or an interrupt must not leave a copier running on its own
            self._kill(proc, rnd)
            raise
        if self.stuck is not proc:
            self.record.copier_gone()
        if proc.returncode not in (0, None) and proc.returncode != -signal.SIGKILL and not rnd.reason:
            rnd.problem("error", f"copier exited with {proc.returncode}: {errors.strip()[-300:]}")

    def _supervise(self, proc: subprocess.Popen, rnd: _Round) -> str:
        sel = selectors.DefaultSelector()
        err_fd = proc.stderr.fileno()
        buffers = {proc.stdout.fileno(): b"", err_fd: b""}
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream.fileno(), selectors.EVENT_READ)
        last = flushed = self.clock.monotonic()
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
                    rnd.problem("error", "stopped before the copy finished")
                    self._kill(proc, rnd)
                    break
                hung = self._hung(rnd, self.clock.monotonic() - last)
                if hung:
                    rnd.problem("unresponsive", hung)
                    self._kill(proc, rnd)
                    self.record.error()
                    break
        finally:
            self.record.flush()
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        if proc.poll() is None and self.stuck is not proc:
            try:
                proc.wait(EXIT_WAIT)
            except subprocess.TimeoutExpired:  # its output closed, it stays: a thread sits in the share
                rnd.problem("unresponsive", f"the copier (pid {proc.pid}) closed its output and did not exit")
                self._kill(proc, rnd)
        return buffers[err_fd].decode(errors="replace")

    @staticmethod
    def _reaped(proc: subprocess.Popen) -> bool:
        """A killed copier leaves once the share answers the request it sits in (FUSE waits it out)."""
        try:
            proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _hung(self, rnd: _Round, quiet: float) -> str:
        """Why the copier counts as hung after `quiet` seconds without a report line; "" while it does not.
        A metadata operation still open in any copy thread gets the short `meta_timeout`."""
        m = self.mirror
        meta_timeout = min(m.meta_timeout, m.file_timeout)
        meta = next((op for op in rnd.ops.values() if op[0] in META_OPS), None)
        if meta is not None and quiet >= meta_timeout:
            (rnd.op, rnd.path), limit = meta, meta_timeout  # the stuck copier is reported in this operation
        elif quiet >= m.file_timeout:
            limit = m.file_timeout
        else:
            return ""
        return f"dest unresponsive: {rnd.op} {rnd.path} made no progress for {format_duration(limit)}"

    def _kill(self, proc: subprocess.Popen, rnd: _Round) -> None:
        """SIGKILL and reap; a copier the kernel keeps (D state) is recorded as stuck in its last operation."""
        proc.kill()
        try:
            proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            self.stuck = proc
            self.record.copier_stuck(proc.pid, rnd.op, rnd.path, self.clock.time())
            self.activity = (rnd.op, rnd.path)
            rnd.reason += f"; its copier (pid {proc.pid}) stays stuck in the kernel in {rnd.op} {rnd.path} until the " \
                          "share answers"

    def _event(self, ev: dict, rnd: _Round) -> None:
        kind = ev["ev"]
        if kind == "op":
            rnd.op, rnd.path = ev["op"], ev["path"]
            rnd.ops[ev.get("w")] = (rnd.op, rnd.path)
            self.activity = (rnd.op, rnd.path)
            return
        if kind in FINISHING:
            rnd.ops.pop(ev.get("w"), None)
        if kind == "tmp":
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


def stuck_reason(pid: int, op: str, path: str, stuck_for: float) -> str:
    where = f" in {op} {path}" if op else ""
    return (f"dest unresponsive: its copier (pid {pid}) is stuck in the kernel{where} for {format_duration(stuck_for)}; "
            "it ends when the share answers")
