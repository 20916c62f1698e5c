"""The cleanup audit log: every deletion (time, policy, path, bytes, reason) in SQLite.

Rows are written in batches inside one transaction per batch, so a run deleting a
million files does not pay a commit per file. A full batch is written behind, on a
thread, while the cleanup loop goes on deleting (the compiled age loop releases the GIL
for a whole batch of names, so SQLite and unlink run on two cores); flush() waits for it,
and a failed write is raised there. Rows older than the retention (history.audit_retention)
are dropped by each write. Per-policy totals are kept in their own table, so dropping old rows
never changes "freed in total".

The files one batch deleted from one directory are one row of cleanup_log: the directory in
path, their count and bytes, and their names and sizes in `names` (JSON). A row per file
cost more than its unlink (three B-trees, a path each). The view cleanup_audit shows every
deleted path on a row of its own, as the table of that name did before (a database that has
that table is converted when it is first opened here).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Callable

from trainguard.actions.cleanup.record.report import printable
from trainguard.config import History

AUDIT_RETENTION: float = History.model_fields["audit_retention"].default  # the config's, for callers without one

SCHEMA = """
CREATE TABLE IF NOT EXISTS cleanup_log (
    ts REAL NOT NULL,
    policy TEXT NOT NULL,
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    files INTEGER NOT NULL,
    reason TEXT NOT NULL,
    names TEXT
);
CREATE INDEX IF NOT EXISTS cleanup_log_ts ON cleanup_log (ts);
CREATE INDEX IF NOT EXISTS cleanup_log_policy_ts ON cleanup_log (policy, ts);
CREATE TABLE IF NOT EXISTS cleanup_totals (
    policy TEXT PRIMARY KEY,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    last_run REAL
);
"""
# Every deleted path on a row of its own (names: [[name, bytes], ...] of files gone from path),
# with the row and the place in it the path came from, for ordering.
_EACH_PATH = """
SELECT ts, policy, mount, path, bytes, files, reason, rowid AS row, -1 AS item FROM cleanup_log WHERE names IS NULL
UNION ALL
SELECT l.ts, l.policy, l.mount, l.path || '/' || json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), 1,
       l.reason, l.rowid, j.key
FROM cleanup_log AS l, json_each(l.names) AS j WHERE l.names IS NOT NULL
"""
_VIEW = f"CREATE VIEW IF NOT EXISTS cleanup_audit AS SELECT ts, policy, mount, path, bytes, files, reason FROM ({_EACH_PATH})"


@dataclass(frozen=True, slots=True)
class Freed:
    policy: str
    files_24h: int
    bytes_24h: int
    files_total: int
    bytes_total: int
    last_run: float | None


class AuditLog:
    """Use one instance per thread (sqlite3 connections are not shared across threads)."""

    def __init__(self, conn: sqlite3.Connection, *, retention: float = AUDIT_RETENTION,
                 clock: Callable[[], float] = time.time, batch: int = 2000):
        self.conn = conn
        self.retention = retention
        self.clock = clock
        self.batch = batch
        self._pending: list[tuple] = []  # rows, or (time, policy, mount, parent, files, reason) for many
        self._rows = 0  # rows in _pending beyond one per item
        self._totals: dict[str, list[int]] = {}
        self._behind: threading.Thread | None = None  # the batch being written behind
        self._failed: BaseException | None = None  # how it failed, raised by the next flush
        conn.executescript(SCHEMA)
        _convert(conn)

    def record(self, policy: str, mount: str, path: str, nbytes: int, files: int, reason: str) -> None:
        self._pending.append((self.clock(), policy, mount, printable(path), nbytes, files, reason))
        self._added(policy, files, nbytes)

    def record_files(self, policy: str, mount: str, parent: str, files: list[tuple[str, int, float]],
                     reason: str) -> None:
        """record() for many single files gone from one directory at once: (name, bytes, age) each, one
        reason. Their row is built where it is written (behind, on the writer's thread)."""
        self._pending.append((self.clock(), policy, mount, parent, files, reason))
        self._rows += len(files) - 1
        self._added(policy, len(files), sum(nbytes for _name, nbytes, _age in files))

    def _added(self, policy: str, files: int, nbytes: int) -> None:
        """Count rows just recorded into the policy's totals; a full batch goes to be written."""
        total = self._totals.setdefault(policy, [0, 0])
        total[0] += files
        total[1] += nbytes
        if len(self._pending) + self._rows >= self.batch:
            self._write_behind()

    def flush(self) -> None:
        """Write every row recorded so far; raises what a write behind raised."""
        self._wait()
        self._write(*self._take())

    def _take(self) -> tuple[list, dict[str, list[int]]]:
        taken = self._pending, self._totals
        self._pending, self._totals, self._rows = [], {}, 0
        return taken

    def _write_behind(self) -> None:
        self._wait()  # one write at a time, in order
        rows, totals = self._take()
        self._behind = threading.Thread(target=self._write_catching, args=(rows, totals),
                                        name="trainguard-audit", daemon=True)
        self._behind.start()

    def _write_catching(self, rows: list, totals: dict[str, list[int]]) -> None:
        try:
            self._write(rows, totals)
        except BaseException as exc:  # handed to the recording thread at its next flush
            self._failed = exc

    def _wait(self) -> None:
        if self._behind is not None:
            self._behind.join()
            self._behind = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def _write(self, rows: list, totals: dict[str, list[int]]) -> None:
        if not rows and not totals:
            return
        now = self.clock()
        # Explicit transaction: the state database's connections are in autocommit mode,
        # where a commit per row would dominate a large run.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.executemany("INSERT INTO cleanup_log VALUES (?, ?, ?, ?, ?, ?, ?, ?)", map(_row, rows))
            # Rows past the retention go with each write (an index range; nothing to find most
            # times), so whatever writes the log keeps it bounded: the daemon, a cron'd
            # `trainguard cleanup`, the in-trainer guard's events.
            self.conn.execute("DELETE FROM cleanup_log WHERE ts < ?", (now - self.retention,))
            for policy, (files, nbytes) in totals.items():
                self.conn.execute(
                    "INSERT INTO cleanup_totals (policy, files, bytes, last_run) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(policy) DO UPDATE SET files = files + excluded.files, "
                    "bytes = bytes + excluded.bytes, last_run = excluded.last_run",
                    (policy, files, nbytes, now),
                )
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def freed(self, *, window: float = 86400.0) -> list[Freed]:
        """Freed files/bytes per policy: in the last `window` seconds and in total."""
        self.flush()
        return read_freed(self.conn, self.clock(), window)

    def entries(self, policy: str | None = None, limit: int = 100) -> list[tuple[float, str, str, int, str]]:
        """The newest deleted paths, one each: (time, policy, path, bytes, reason)."""
        self.flush()
        where, args = ("WHERE policy = ?", (policy,)) if policy is not None else ("", ())
        return list(self.conn.execute(f"SELECT ts, policy, path, bytes, reason FROM ({_EACH_PATH}) {where} "
                                      "ORDER BY ts DESC, row DESC, item DESC LIMIT ?", args + (limit,)))


def _row(item: tuple) -> tuple:
    """A cleanup_log row: record()'s as it came, or record_files()'s batch with its names."""
    if len(item) == 7:
        return item + (None,)
    now, policy, mount, parent, files, reason = item
    names = json.dumps([(printable(name), nbytes) for name, nbytes, _age in files], ensure_ascii=False)
    return now, policy, mount, printable(parent), sum(nbytes for _n, nbytes, _a in files), len(files), reason, names


def _convert(conn: sqlite3.Connection) -> None:
    """A database whose cleanup_audit is a table (a row per file) gets its rows moved into
    cleanup_log and the view in its place, in one transaction (another process may open it too)."""
    if conn.execute("SELECT type FROM sqlite_master WHERE name = 'cleanup_audit'").fetchone() != ("table",):
        conn.execute(_VIEW)
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("SELECT type FROM sqlite_master WHERE name = 'cleanup_audit'").fetchone() == ("table",):
            conn.execute("INSERT INTO cleanup_log (ts, policy, mount, path, bytes, files, reason) "
                         "SELECT ts, policy, mount, path, bytes, files, reason FROM cleanup_audit ORDER BY rowid")
            conn.execute("DROP TABLE cleanup_audit")
            conn.execute(_VIEW)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def freed_totals(conn: sqlite3.Connection) -> dict[str, int] | None:
    """Bytes freed per policy since the state db was created (the running totals);
    None before any cleanup has run. One tiny table: cheap enough to read every cycle."""
    try:
        return dict(conn.execute("SELECT policy, bytes FROM cleanup_totals"))
    except sqlite3.OperationalError:  # the table does not exist until cleanup first runs
        return None


def read_freed(conn: sqlite3.Connection, now: float, window: float = 86400.0) -> list[Freed]:
    """Freed per policy from a (read-only) connection, for `trainguard status`; [] before any cleanup."""
    recent = {}
    for table in ("cleanup_log", "cleanup_audit"):  # the table a database not yet converted has
        try:
            recent = {p: (f, b) for p, f, b in conn.execute(
                f"SELECT policy, SUM(files), SUM(bytes) FROM {table} WHERE ts >= ? GROUP BY policy", (now - window,))}
            break
        except sqlite3.OperationalError:
            continue
    try:
        rows = list(conn.execute("SELECT policy, files, bytes, last_run FROM cleanup_totals ORDER BY policy"))
    except sqlite3.OperationalError:  # no cleanup has ever run: the tables do not exist yet
        return []
    return [Freed(p, (recent.get(p) or (0, 0))[0] or 0, (recent.get(p) or (0, 0))[1] or 0, f, b, last)
            for p, f, b, last in rows]
