"""The cleanup cycles the fill forecast has learned per mount, kept in the state database.

A saw-tooth's rhythm (a daily cleanup, a GC every few hours) is learned from the cycles seen, and a
rhythm longer than the forecast window is known only from them: lost with the process, a restart or one
unreadable sample would turn the next approach to a low into a false alarm. Each mount's cycles are
plain rows (when the cleanup came, the free bytes just before it, the bytes it freed); what to remember
and for how long is the forecast's decision (detectors.sawtooth.merge): this table mirrors its choice.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

SCHEMA = """CREATE TABLE IF NOT EXISTS forecast_cycles (
    mount TEXT NOT NULL, ts REAL NOT NULL, low REAL NOT NULL, freed REAL NOT NULL,
    PRIMARY KEY (mount, ts)) WITHOUT ROWID"""
KEEP = 7 * 86400.0  # rows of a mount no longer watched go after this (the forecast remembers no longer)

Row = tuple[float, float, float]  # (ts, low, freed)


def read(conn: sqlite3.Connection, now: float) -> dict[str, tuple[Row, ...]]:
    """Each mount's cycles as last saved, oldest first (none from after `now`: the clock went back);
    empty from a database without the table (a read-only one that an older version wrote)."""
    out: dict[str, list[Row]] = {}
    try:
        rows = conn.execute("SELECT mount, ts, low, freed FROM forecast_cycles WHERE ts BETWEEN ? AND ? "
                            "ORDER BY mount, ts", (now - KEEP, now)).fetchall()
    except sqlite3.OperationalError:
        return {}
    for mount, ts, low, freed in rows:
        out.setdefault(mount, []).append((ts, low, freed))
    return {mount: tuple(rows) for mount, rows in out.items()}


class LearnedCycles:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        conn.execute(SCHEMA)
        self._saved: dict[str, tuple[Row, ...]] = {}

    def load(self, now: float) -> dict[str, tuple[Row, ...]]:
        self._saved = read(self.conn, now)
        return dict(self._saved)

    def save(self, mount: str, rows: Sequence[Row], now: float) -> None:
        """Replace the mount's cycles with `rows` when they changed (a cleanup learned or forgotten: rarely)."""
        rows = tuple(rows)
        if self._saved.get(mount) == rows:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM forecast_cycles WHERE mount = ? OR ts < ?", (mount, now - KEEP))
            self.conn.executemany("INSERT OR REPLACE INTO forecast_cycles(mount, ts, low, freed) VALUES (?, ?, ?, ?)",
                                  [(mount, *row) for row in rows])
        self._saved[mount] = rows
