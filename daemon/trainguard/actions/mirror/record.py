"""What is on the share, as far as we know: the state db's record of every copied file.

A file is on the share when its local size and mtime equal the ones recorded at its last copy, so a
restart does not copy again, and the share is never asked (a stat there may hang). A local file that
differs is pending from `dirty_since`, the first time the difference was seen (or its mtime, if older,
but not before the mirror was first run): the mirror's lag is how long its oldest pending change waited.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Iterable

from trainguard.records import MirrorState
from trainguard.sources.procs import read_start, read_threads

SCHEMA = """
CREATE TABLE IF NOT EXISTS mirror_files (
    mirror TEXT NOT NULL,
    path BLOB NOT NULL,          -- relative to source, as bytes (names need not be UTF-8)
    size INTEGER,                -- what the last copy wrote; NULL: never copied
    mtime_ns INTEGER,
    digest TEXT,                 -- of the copied bytes' first and last 64 KiB (append check)
    dirty_since REAL,            -- wall time the local file was first seen to differ; NULL: on the share
    PRIMARY KEY (mirror, path)
);
CREATE TABLE IF NOT EXISTS mirror_temps (
    mirror TEXT NOT NULL,
    path BLOB NOT NULL,          -- a temporary name on the share a killed copy may have left
    PRIMARY KEY (mirror, path)
);
CREATE TABLE IF NOT EXISTS mirror_runs (
    mirror TEXT PRIMARY KEY,
    created REAL NOT NULL,
    bytes_total INTEGER NOT NULL DEFAULT 0,
    errors_total INTEGER NOT NULL DEFAULT 0,
    last_run REAL,
    last_ok REAL,
    oldest_pending REAL,
    pending_files INTEGER NOT NULL DEFAULT 0,
    pending_bytes INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    reason_kind TEXT NOT NULL DEFAULT '',
    dest TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS mirror_copiers (
    mirror TEXT PRIMARY KEY,     -- at most one copier per mirror, whichever process started it
    pid INTEGER NOT NULL,
    start_ticks INTEGER NOT NULL, -- its start time (/proc/PID/stat): a later process reusing the PID is not it
    op TEXT NOT NULL DEFAULT '', -- once stuck: the operation on the share it sits in, and the path
    path TEXT NOT NULL DEFAULT '',
    stuck_since REAL             -- wall time it was killed and the kernel kept it; NULL: still copying
);
"""


@dataclass(frozen=True, slots=True)
class Copied:
    size: int
    mtime_ns: int
    digest: str


@dataclass(frozen=True, slots=True)
class Entry:
    copied: Copied | None
    dirty_since: float | None


class Record:
    """One mirror's rows; used from one thread (the mirror's own, or the `trainguard mirror` command)."""

    def __init__(self, conn: sqlite3.Connection, mirror: str, dest: str, now: float):
        self.conn = conn
        self.mirror = mirror
        self._queued: list[tuple[str, list[tuple]]] = []
        conn.executescript(SCHEMA)
        conn.execute("INSERT OR IGNORE INTO mirror_runs (mirror, created, dest) VALUES (?, ?, ?)", (mirror, now, dest))
        self.created = conn.execute("SELECT created FROM mirror_runs WHERE mirror = ?", (mirror,)).fetchone()[0]

    def entries(self) -> dict[bytes, Entry]:
        self.flush()
        rows = self.conn.execute("SELECT path, size, mtime_ns, digest, dirty_since FROM mirror_files "
                                 "WHERE mirror = ?", (self.mirror,))
        return {bytes(p): Entry(Copied(s, m, d) if s is not None else None, ds) for p, s, m, d, ds in rows}

    def _write(self, sql: str, rows: list[tuple]) -> None:
        self._queued.append((sql, rows))

    def flush(self) -> None:
        """Queued writes in one short transaction: a copier reporting thousands of files never holds the db."""
        if not self._queued:
            return
        with self.conn:
            for sql, rows in self._queued:
                self.conn.executemany(sql, rows)
        self._queued.clear()

    def mark_dirty(self, paths: Iterable[tuple[bytes, float]]) -> None:
        self._write("INSERT INTO mirror_files (mirror, path, dirty_since) VALUES (?, ?, ?) "
                    "ON CONFLICT (mirror, path) DO UPDATE SET dirty_since = excluded.dirty_since",
                    [(self.mirror, p, since) for p, since in paths])

    def forget(self, paths: Iterable[bytes]) -> None:
        """Files gone from the source: nothing to copy, nothing to remember (the share keeps its copy)."""
        self._write("DELETE FROM mirror_files WHERE mirror = ? AND path = ?", [(self.mirror, p) for p in paths])

    def copied(self, path: bytes, copy: Copied, nbytes: int) -> None:
        self._write("INSERT INTO mirror_files (mirror, path, size, mtime_ns, digest) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (mirror, path) DO UPDATE SET size = excluded.size, mtime_ns = excluded.mtime_ns, "
                    "digest = excluded.digest, dirty_since = NULL",
                    [(self.mirror, path, copy.size, copy.mtime_ns, copy.digest)])
        self._write("UPDATE mirror_runs SET bytes_total = bytes_total + ? WHERE mirror = ?", [(nbytes, self.mirror)])

    def error(self) -> None:
        self._write("UPDATE mirror_runs SET errors_total = errors_total + 1 WHERE mirror = ?", [(self.mirror,)])

    def temps(self) -> list[bytes]:
        self.flush()
        rows = self.conn.execute("SELECT path FROM mirror_temps WHERE mirror = ?", (self.mirror,))
        return [bytes(p) for (p,) in rows]

    def temp_created(self, path: bytes) -> None:
        self._write("INSERT OR IGNORE INTO mirror_temps (mirror, path) VALUES (?, ?)", [(self.mirror, path)])

    def temp_gone(self, path: bytes) -> None:
        self._write("DELETE FROM mirror_temps WHERE mirror = ? AND path = ?", [(self.mirror, path)])

    def copier(self) -> CopierRow | None:
        """The copier some process started for this mirror and has not seen end (it may be gone since)."""
        self.flush()
        return copier_rows(self.conn).get(self.mirror)

    def copier_started(self, pid: int) -> None:
        """Written at once: another process (the daemon, `trainguard mirror`) must not start a second one."""
        seen = read_start("/proc", pid)
        self.flush()
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO mirror_copiers (mirror, pid, start_ticks) VALUES (?, ?, ?)",
                              (self.mirror, pid, seen[1] if seen else -1))

    def copier_stuck(self, pid: int, op: str, path: str, since: float) -> None:
        self.flush()
        with self.conn:
            self.conn.execute("UPDATE mirror_copiers SET op = ?, path = ?, stuck_since = ? WHERE mirror = ? AND pid = ?",
                              (op, path, since, self.mirror, pid))

    def copier_gone(self) -> None:
        self.flush()
        with self.conn:
            self.conn.execute("DELETE FROM mirror_copiers WHERE mirror = ?", (self.mirror,))

    def states(self) -> list[MirrorState]:
        self.flush()
        return read_states(self.conn, [self.mirror])

    def pending(self, state: MirrorState) -> MirrorState:
        """What waits now, stored before the copy starts (the last round's reason stays)."""
        self.flush()
        with self.conn:
            self.conn.execute("UPDATE mirror_runs SET oldest_pending = ?, pending_files = ?, pending_bytes = ? "
                              "WHERE mirror = ?",
                              (state.oldest_pending, state.pending_files, state.pending_bytes, self.mirror))
        return state

    def finish(self, state: MirrorState) -> MirrorState:
        """Store the round's outcome; returns the state with the stored totals and last_ok."""
        ok = state.pending_files == 0 and not state.reason
        self.flush()
        with self.conn:
            self.conn.execute(
                "UPDATE mirror_runs SET last_run = ?, last_ok = CASE WHEN ? THEN ? ELSE last_ok END, "
                "oldest_pending = ?, pending_files = ?, pending_bytes = ?, reason = ?, reason_kind = ?, dest = ? "
                "WHERE mirror = ?",
                (state.ts, ok, state.ts, state.oldest_pending, state.pending_files, state.pending_bytes, state.reason,
                 state.reason_kind, state.dest, self.mirror))
        return self.states()[0]


@dataclass(frozen=True, slots=True)
class CopierRow:
    pid: int
    start_ticks: int
    op: str
    path: str
    stuck_since: float | None

    def alive(self, proc_root: str = "/proc") -> bool:
        """Still there, and not a later process with its PID. A killed copier shows as a zombie as soon as its
        main thread is gone, while a copy thread still sits in the share's request: it counts until that ends."""
        seen = read_start(proc_root, self.pid)
        if seen is None or seen[1] != self.start_ticks:
            return False
        return seen[0] not in ("Z", "X") or any(t.state not in ("Z", "X") for t in read_threads(proc_root, self.pid))


def copier_rows(conn: sqlite3.Connection) -> dict[str, CopierRow]:
    try:
        rows = conn.execute("SELECT mirror, pid, start_ticks, op, path, stuck_since FROM mirror_copiers").fetchall()
    except sqlite3.OperationalError:  # a state db from before copiers were recorded
        return {}
    return {r[0]: CopierRow(*r[1:]) for r in rows}


def read_states(conn: sqlite3.Connection, names: Iterable[str] | None = None) -> list[MirrorState]:
    """Each mirror's last stored state (for `status` and a restarted daemon); [] before any mirror ran."""
    try:
        rows = conn.execute("SELECT mirror, dest, last_run, oldest_pending, pending_files, pending_bytes, bytes_total, "
                            "errors_total, last_ok, reason, reason_kind FROM mirror_runs ORDER BY mirror").fetchall()
    except sqlite3.OperationalError:  # no mirror has run against this database
        return []
    wanted = set(names) if names is not None else None
    copiers = {name: c for name, c in copier_rows(conn).items() if c.stuck_since is not None and c.alive()}
    return [MirrorState(name=r[0], dest=r[1], ts=r[2] or 0.0, oldest_pending=r[3], pending_files=r[4],
                        pending_bytes=r[5], bytes_total=r[6], errors_total=r[7], last_ok=r[8], reason=r[9],
                        reason_kind=r[10], **_stuck(copiers.get(r[0])))
            for r in rows if wanted is None or r[0] in wanted]


def _stuck(c: CopierRow | None) -> dict:
    if c is None:
        return {}
    return {"stuck_pid": c.pid, "stuck_op": c.op, "stuck_path": c.path, "stuck_since": c.stuck_since}


def last_copy(conn: sqlite3.Connection, mirror: str, rel: bytes) -> Copied | None:
    """What the last copy of `rel` (relative to the mirror's source) wrote to the share, from the record
    alone; None when it was never copied. The share is not asked."""
    try:
        row = conn.execute("SELECT size, mtime_ns, digest FROM mirror_files WHERE mirror = ? AND path = ? "
                           "AND size IS NOT NULL", (mirror, rel)).fetchone()
    except sqlite3.OperationalError:
        return None
    return Copied(*row) if row else None
