"""The notification outbox: every alert for every target is written here before any send.

One row per (event, target), so each target succeeds or fails on its own. A row is
pending until apprise reports success (delivered) or it is older than max_age
(failed, logged). Retries back off exponentially with jitter, capped. The table is
bounded: past max_pending, the oldest of the least severe rows are dropped, counted
and logged, so a target that is down for days cannot fill the disk. The row's time
fields are wall-clock times, so a restart resumes exactly where it stopped.

When the state database cannot be written (its disk is full), new rows go to an outbox of
the same shape in memory (memory_outbox()); the target workers deliver from both and move
the memory rows back to the database as soon as it accepts them.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Sequence

from trainguard.alerts.lifecycle import finding_from_json, finding_to_json
from trainguard.records import AlertEvent, AlertStatus

log = logging.getLogger("trainguard.notify")

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    target TEXT NOT NULL,            -- notify.targets[].name
    host TEXT NOT NULL,              -- messages are grouped per host
    severity INTEGER NOT NULL,       -- Severity.rank: the drop order when the outbox is full
    created REAL NOT NULL,           -- wall time it was enqueued
    status TEXT NOT NULL,            -- alert status: firing | resolved
    started_at REAL NOT NULL,
    ts REAL NOT NULL,
    repeat INTEGER NOT NULL,
    finding TEXT NOT NULL,           -- JSON
    state TEXT NOT NULL DEFAULT 'pending',   -- pending | delivered | failed
    attempts INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL,          -- wall time of the next attempt
    last_error TEXT,                 -- redacted
    done_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (state, target, next_try);
CREATE TABLE IF NOT EXISTS outbox_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

PENDING = "pending"  # then "delivered" or "failed", set in the SQL below
KEEP_DELIVERED = 24 * 3600.0  # delivered rows are kept for the "last 24 h" figure of `trainguard status`
KEEP_FAILED = 7 * 86400.0


FAILED_PREFIX = "failed:"


def failed_attempts(conn: sqlite3.Connection, targets: Iterable[str]) -> dict[str, int]:
    """target -> failed delivery attempts since the state db was created (0 for targets never failing)."""
    counts = {t: 0 for t in targets}
    try:
        rows = conn.execute("SELECT name, value FROM outbox_counters WHERE name LIKE ?", (FAILED_PREFIX + "%",))
        for name, value in rows:
            target = name[len(FAILED_PREFIX):]
            if target in counts:
                counts[target] = int(value)
    except sqlite3.OperationalError:  # no outbox yet
        pass
    return counts


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    target: str
    host: str
    event: AlertEvent
    created: float
    attempts: int
    next_try: float
    last_error: str | None


def backoff(attempts: int, initial: float, cap: float, random: Callable[[], float]) -> float:
    """Delay before attempt attempts+1: initial * 2^(attempts-1), capped, scaled by a jitter in [0.5, 1)."""
    base = min(cap, initial * (2 ** max(0, attempts - 1)))
    return base * (0.5 + 0.5 * random())


class Outbox:
    """The outbox table, on its own connection (one Outbox per thread)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        conn.executescript(SCHEMA)

    def enqueue(self, items: Iterable[tuple[str, str, AlertEvent]], now: float, *, delay: float = 0.0,
                max_pending: int | None = None) -> int:
        """Store (target, host, event) rows, due at now + delay. Returns how many old rows were dropped."""
        rows = [(target, host, e.finding.severity.rank, now, e.status.value, e.started_at, e.ts, int(e.repeat),
                 finding_to_json(e.finding), now + delay) for target, host, e in items]
        if not rows:
            return 0
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "INSERT INTO outbox (target, host, severity, created, status, started_at, ts, repeat, finding, "
                "next_try) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            dropped = self._enforce_bound(max_pending) if max_pending else 0
        return dropped

    def _enforce_bound(self, max_pending: int) -> int:
        (pending,) = self.conn.execute("SELECT COUNT(*) FROM outbox WHERE state = ?", (PENDING,)).fetchone()
        excess = pending - max_pending
        if excess <= 0:
            return 0
        self.conn.execute(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE state = ? "
            "ORDER BY severity ASC, created ASC, id ASC LIMIT ?)", (PENDING, excess))
        self._count("dropped", excess)
        return excess

    def _count(self, name: str, n: int) -> None:
        self.conn.execute("INSERT INTO outbox_counters (name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value", (name, n))

    def count_failed_attempt(self, target: str) -> None:
        """Failed delivery attempts per target only ever go up (rows get pruned): the metrics counter."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self._count(f"{FAILED_PREFIX}{target}", 1)

    def due(self, target: str, now: float, limit: int, created_upto: float | None = None,
            exclude: Collection[int] = ()) -> list[Entry]:
        """The oldest due rows of one target, all for the same host (one message); `exclude`: ids whose
        outcome is known but could not be written yet."""
        upto = now if created_upto is None else created_upto
        skip = _not_in(exclude)
        first = self.conn.execute(
            f"SELECT host FROM outbox WHERE state = ? AND target = ? AND next_try <= ? AND created <= ?{skip} "
            "ORDER BY id LIMIT 1", (PENDING, target, now, upto)).fetchone()
        if first is None:
            return []
        rows = self.conn.execute(
            "SELECT id, target, host, created, status, started_at, ts, repeat, finding, attempts, next_try, "
            f"last_error FROM outbox WHERE state = ? AND target = ? AND host = ? AND next_try <= ? AND created <= ?"
            f"{skip} ORDER BY id LIMIT ?", (PENDING, target, first[0], now, upto, limit)).fetchall()
        return [_entry(r) for r in rows]

    def move_rows(self, target: str, into: "Outbox") -> int:
        """Move this outbox's rows of one target (pending and done) into another (memory -> database),
        keeping their states, times and attempts. Raises, moving nothing, when `into` cannot be written."""
        columns = ("target, host, severity, created, status, started_at, ts, repeat, finding, state, attempts, "
                   "next_try, last_error, done_at")
        rows = self.conn.execute(f"SELECT id, {columns} FROM outbox WHERE target = ? ORDER BY id",
                                 (target,)).fetchall()
        if not rows:
            return 0
        with into.conn:
            into.conn.execute("BEGIN IMMEDIATE")
            into.conn.executemany(f"INSERT INTO outbox ({columns}) VALUES ({','.join('?' * 14)})",
                                  [r[1:] for r in rows])
        with self.conn:
            self.conn.executemany("DELETE FROM outbox WHERE id = ?", [(r[0],) for r in rows])
        return len(rows)

    def holds(self, target: str) -> bool:
        return self.conn.execute("SELECT 1 FROM outbox WHERE target = ? LIMIT 1", (target,)).fetchone() is not None

    def next_due(self, target: str, exclude: Collection[int] = ()) -> float | None:
        skip = _not_in(exclude)
        (value,) = self.conn.execute(f"SELECT MIN(next_try) FROM outbox WHERE state = ? AND target = ?{skip}",
                                     (PENDING, target)).fetchone()
        return value

    def delivered(self, ids: Sequence[int], now: float) -> None:
        self._update(ids, "UPDATE outbox SET state = 'delivered', done_at = ?, attempts = attempts + 1, "
                          "last_error = NULL WHERE id = ?", (now,))

    def retry(self, ids: Sequence[int], next_try: float, error: str) -> None:
        self._update(ids, "UPDATE outbox SET attempts = attempts + 1, next_try = ?, last_error = ? WHERE id = ?",
                     (next_try, error))

    def fail(self, ids: Sequence[int], now: float, error: str) -> None:
        self._update(ids, "UPDATE outbox SET state = 'failed', done_at = ?, last_error = ? WHERE id = ?",
                     (now, error))

    def _update(self, ids: Sequence[int], sql: str, params: tuple[Any, ...]) -> None:
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(sql, [(*params, i) for i in ids])

    def expired(self, target: str, created_before: float) -> list[Entry]:
        rows = self.conn.execute(
            "SELECT id, target, host, created, status, started_at, ts, repeat, finding, attempts, next_try, "
            "last_error FROM outbox WHERE state = ? AND target = ? AND created < ? ORDER BY id",
            (PENDING, target, created_before)).fetchall()
        return [_entry(r) for r in rows]

    def fail_targets_except(self, names: Iterable[str], now: float) -> int:
        """Pending rows of targets no longer configured can never be sent: mark them failed."""
        names = list(names)
        marks = ",".join("?" * len(names))
        where = f"state = ? AND target NOT IN ({marks})" if names else "state = ?"
        with self.conn:
            cur = self.conn.execute(
                f"UPDATE outbox SET state = 'failed', done_at = ?, last_error = 'target removed from the config' "
                f"WHERE {where}", (now, PENDING, *names))
        return cur.rowcount

    def prune(self, now: float) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM outbox WHERE (state = 'delivered' AND done_at < ?) "
                              "OR (state = 'failed' AND done_at < ?)", (now - KEEP_DELIVERED, now - KEEP_FAILED))


class _Shared:
    """One in-memory connection used by several threads: each statement and each `with` block runs alone."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._lock = threading.RLock()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> "_Result":
        with self._lock:
            cur = self._conn.execute(sql, params)
            return _Result(cur.fetchall(), cur.rowcount)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> "_Result":
        with self._lock:
            cur = self._conn.executemany(sql, rows)
            return _Result([], cur.rowcount)

    def executescript(self, script: str) -> None:
        with self._lock:
            self._conn.executescript(script)

    def __enter__(self) -> "_Shared":
        self._lock.acquire()
        self._conn.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.__exit__(*exc)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


@dataclass
class _Result:
    rows: list[tuple[Any, ...]]
    rowcount: int

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def __iter__(self):
        return iter(self.rows)


def memory_outbox() -> Outbox:
    """An outbox in memory, for the alerts that cannot be written to the state database; every thread
    may use the returned object."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    return Outbox(_Shared(conn))  # type: ignore[arg-type]


def _not_in(ids: Collection[int]) -> str:
    """An SQL condition leaving out these row ids (integers only, so it is safe to inline)."""
    return f" AND id NOT IN ({','.join(str(int(i)) for i in ids)})" if ids else ""


def _entry(r: tuple[Any, ...]) -> Entry:
    event = AlertEvent(AlertStatus(r[4]), finding_from_json(r[8]), started_at=r[5], ts=r[6], repeat=bool(r[7]))
    return Entry(id=r[0], target=r[1], host=r[2], event=event, created=r[3], attempts=r[9], next_try=r[10],
                 last_error=r[11])


def summary(conn: sqlite3.Connection | None, now: float) -> dict[str, Any]:
    """The outbox for `trainguard status`; works on a read-only connection and on a database without it."""
    doc: dict[str, Any] = {"pending": 0, "retrying": [], "failed_24h": 0, "delivered_24h": 0, "dropped": 0,
                           "targets": {}}
    if conn is None:
        return doc
    try:
        per_target = conn.execute(
            "SELECT target, "
            " SUM(state = 'pending' AND attempts = 0), SUM(state = 'pending' AND attempts > 0),"
            " SUM(state = 'failed' AND done_at >= ?), SUM(state = 'delivered' AND done_at >= ?),"
            " MIN(CASE WHEN state = 'pending' THEN next_try END)"
            " FROM outbox GROUP BY target ORDER BY target", (now - KEEP_DELIVERED, now - KEEP_DELIVERED)).fetchall()
        retrying = conn.execute(
            "SELECT target, COUNT(*), MAX(attempts), MIN(next_try), MIN(created), "
            " (SELECT last_error FROM outbox o2 WHERE o2.target = o.target AND o2.state = 'pending' "
            "  AND o2.attempts > 0 ORDER BY o2.id DESC LIMIT 1) "
            "FROM outbox o WHERE state = 'pending' AND attempts > 0 GROUP BY target ORDER BY target").fetchall()
        counters = dict(conn.execute("SELECT name, value FROM outbox_counters").fetchall())
    except sqlite3.OperationalError:  # no outbox table: a database from before notify targets existed
        return doc
    for target, fresh, retry, failed, delivered, next_try in per_target:
        doc["targets"][target] = {"pending": int(fresh or 0) + int(retry or 0), "retrying": int(retry or 0),
                                  "failed_24h": int(failed or 0), "delivered_24h": int(delivered or 0),
                                  "next_try": next_try}
        doc["pending"] += int(fresh or 0) + int(retry or 0)
        doc["failed_24h"] += int(failed or 0)
        doc["delivered_24h"] += int(delivered or 0)
    doc["retrying"] = [{"target": t, "alerts": n, "attempts": a, "next_try": nt, "oldest": oldest,
                        "last_error": err} for t, n, a, nt, oldest, err in retrying]
    doc["dropped"] = int(counters.get("dropped", 0))
    return doc
