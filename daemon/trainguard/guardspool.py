"""The guard's event spool: how trainguard.guard, inside a trainer, tells the daemon what it did.

One JSON object per line in <state dir>/guard-events.jsonl. Writers append a line under an
exclusive flock; the daemon takes the same lock, reads everything and truncates, so no line is
read twice or lost between a read and the truncate. Stdlib only and cheap to import: this runs
in the training process.
"""

from __future__ import annotations

import os
from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

GUARD_EVENTS_FILE = "guard-events.jsonl"
MAX_BYTES = 1 << 20  # with no daemon draining it, the spool stops growing here


_FIELDS = ("ts", "kind", "path", "pid", "bytes", "avail", "reserve", "removed", "source", "message", "step")


class GuardEvent(namedtuple("GuardEvent", _FIELDS, defaults=(0, None, None, (), "save_checkpoint", "", 0))):
    """One thing the in-trainer guard did: ts (wall time), kind ("saved", "fallback", "wont-fit", "progress",
    "stopped"), path, pid, bytes (the checkpoint's size, or the estimate that did not fit), avail
    (df's Avail then), reserve, removed ((path, bytes) deleted by keep_last), source
    ("save_checkpoint", "transformers", "lightning", "progress"), message; step: for kind "progress"
    (a heartbeat from trainguard.guard.progress), the training step it reported.

    A plain named tuple (immutable), not a dataclass: the guard runs inside the trainer and imports
    neither dataclasses nor typing, which would cost more than the rest of it together."""

    __slots__ = ()

    def to_json(self) -> str:
        import json

        data = {"ts": self.ts, "kind": self.kind, "path": self.path, "pid": self.pid, "bytes": self.bytes,
                "avail": self.avail, "reserve": self.reserve, "removed": [list(r) for r in self.removed],
                "source": self.source, "message": self.message, "step": self.step}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GuardEvent":
        """Raises KeyError, TypeError or ValueError on a malformed record."""
        removed = tuple((str(p), int(n)) for p, n in data.get("removed") or ())
        avail, reserve = data.get("avail"), data.get("reserve")
        return cls(float(data["ts"]), str(data["kind"]), str(data["path"]), int(data["pid"]),
                   int(data.get("bytes") or 0), None if avail is None else int(avail),
                   None if reserve is None else int(reserve), removed, str(data.get("source") or ""),
                   str(data.get("message") or ""), int(data.get("step") or 0))


def append(spool: str, event: GuardEvent) -> str | None:
    """Append one line; returns None, or why the line was not written (never raises OSError)."""
    import fcntl

    line = (event.to_json() + "\n").encode()
    try:
        fd = os.open(spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        return f"cannot open {spool}: {exc.strerror}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size + len(line) > MAX_BYTES:
            return f"{spool} is full (no daemon draining it?)"
        os.write(fd, line)
        return None
    except OSError as exc:  # the state dir may sit on the very disk that is full
        return f"cannot write {spool}: {exc.strerror}"
    finally:
        os.close(fd)


def drain(spool: str) -> tuple[list[GuardEvent], int]:
    """Take every event out of the spool: (events, malformed lines skipped)."""
    import fcntl

    try:
        fd = os.open(spool, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    import json

    out, bad = [], 0
    for line in b"".join(chunks).splitlines():
        try:
            out.append(GuardEvent.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
    return out, bad
