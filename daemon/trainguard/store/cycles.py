"""The cleanup cycles and the writes the fill forecast has learned per mount, kept in the state database.

A saw-tooth's rhythm (a daily cleanup, a GC every few hours) is learned from the cycles seen, and a
rhythm longer than the forecast window is known only from them: lost with the process, a restart or one
unreadable sample would turn the next approach to a low into a false alarm. A writer's pace is learned
from a day of its checkpoint-sized writes, where the window holds a few. Each mount's are plain rows
(detectors.follow.learned): a cleanup (when it came, the free bytes just before it, the bytes it freed),
a write (when it began, the seconds since the one before it, minus the bytes it wrote); what to remember
and for how long is the forecast's decision (detectors.sawtooth.merge, detectors.staircase.remember):
these tables mirror its choice. Writes have a table of their own, which versions before them do not read.

A rhythm belongs to a filesystem, not to the path it is mounted on: each mount's rows carry the identity
of the filesystem that showed them, and another disk mounted at the same path starts with nothing learned.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from trainguard.records import FsSample

SCHEMA = """CREATE TABLE IF NOT EXISTS forecast_cycles (
    mount TEXT NOT NULL, ts REAL NOT NULL, low REAL NOT NULL, freed REAL NOT NULL, fs TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (mount, ts)) WITHOUT ROWID"""
WRITES_SCHEMA = """CREATE TABLE IF NOT EXISTS forecast_writes (
    mount TEXT NOT NULL, ts REAL NOT NULL, after REAL NOT NULL, nbytes REAL NOT NULL, fs TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (mount, ts)) WITHOUT ROWID"""
KEEP = 7 * 86400.0  # rows of a mount no longer watched go after this (the forecast remembers no longer)

Row = tuple[float, float, float]  # (ts, low, freed): a cleanup; (start, after, -nbytes): a write
Learned = tuple[str, tuple[Row, ...]]  # (the identity of the filesystem that showed them, its rows)


def identity(sample: FsSample) -> str:
    """Which filesystem a mount shows: its device number and statvfs's f_fsid (the UUID on ext4, xfs's and
    btrfs's own), so a disk that takes another's place, even in the same device slot, is told apart.
    Empty while the mount does not answer: nothing is decided on a probe that failed."""
    if sample.usage is None:
        return ""
    return f"{sample.mount.major}:{sample.mount.minor}:{sample.usage.fsid:x}"


def read_learned(conn: sqlite3.Connection, now: float) -> dict[str, Learned]:
    """Each mount's cycles as last saved, oldest first (none from after `now`: the clock went back), with
    the filesystem they were seen on ("" in rows an older version wrote); empty from a database without
    the table or the column (a read-only one that an older version wrote)."""
    out: dict[str, tuple[str, list[Row]]] = {}
    try:
        rows = conn.execute("SELECT mount, ts, low, freed, fs FROM forecast_cycles WHERE ts BETWEEN ? AND ?",
                            (now - KEEP, now)).fetchall()
    except sqlite3.OperationalError:
        return {}
    try:
        rows += conn.execute("SELECT mount, ts, after, -nbytes, fs FROM forecast_writes WHERE ts BETWEEN ? AND ?",
                             (now - KEEP, now)).fetchall()
    except sqlite3.OperationalError:
        pass  # a database an older version wrote, opened read-only: its cycles still count
    for mount, ts, low, freed, fs in sorted(rows):
        out.setdefault(mount, (fs, []))[1].append((ts, low, freed))
    return {mount: (fs, tuple(rows)) for mount, (fs, rows) in out.items()}


def read(conn: sqlite3.Connection, now: float) -> dict[str, tuple[Row, ...]]:
    """Each mount's cycles, whichever filesystem showed them."""
    return {mount: rows for mount, (_, rows) in read_learned(conn, now).items()}


def belongs(learned_on: str, now_showing: str) -> bool:
    """May what was learned on filesystem `learned_on` be used for the one a mount shows now? Rows an older
    version wrote and a mount that does not answer now are taken as one: nothing tells them apart."""
    return not learned_on or not now_showing or learned_on == now_showing


def same_filesystem(learned: Mapping[str, Learned], filesystems: Iterable[FsSample]) -> dict[str, tuple[Row, ...]]:
    """The rows of each watched mount that shows the filesystem they were learned on."""
    shown = {s.mount.mount_point: identity(s) for s in filesystems}
    return {mount: rows for mount, (fs, rows) in learned.items() if mount in shown and belongs(fs, shown[mount])}


def _migrate(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(forecast_cycles)")}
    if "fs" not in columns:  # a table an older version made: its rows are kept, their filesystem unknown
        conn.execute("ALTER TABLE forecast_cycles ADD COLUMN fs TEXT NOT NULL DEFAULT ''")


class LearnedCycles:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        conn.execute(SCHEMA)
        conn.execute(WRITES_SCHEMA)
        _migrate(conn)
        self._saved: dict[str, Learned] = {}
        self.learned_on: dict[str, str] = {}  # mount -> the filesystem its saved cycles were seen on

    def load(self, now: float) -> dict[str, tuple[Row, ...]]:
        self._saved = read_learned(self.conn, now)
        self.learned_on = {mount: fs for mount, (fs, _) in self._saved.items()}
        return {mount: rows for mount, (_, rows) in self._saved.items()}

    def save(self, mount: str, rows: Sequence[Row], now: float, fs: str = "") -> None:
        """Replace the mount's cycles and writes with `rows`, seen on filesystem `fs`, when they changed (a
        cleanup or a write learned or forgotten, another filesystem mounted there)."""
        learned = (fs, tuple(rows))
        if self._saved.get(mount) == learned:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM forecast_cycles WHERE mount = ? OR ts < ?", (mount, now - KEEP))
            self.conn.execute("DELETE FROM forecast_writes WHERE mount = ? OR ts < ?", (mount, now - KEEP))
            self.conn.executemany("INSERT OR REPLACE INTO forecast_cycles(mount, ts, low, freed, fs) "
                                  "VALUES (?, ?, ?, ?, ?)", [(mount, *row, fs) for row in learned[1] if row[2] > 0])
            self.conn.executemany("INSERT OR REPLACE INTO forecast_writes(mount, ts, after, nbytes, fs) "
                                  "VALUES (?, ?, ?, ?, ?)",
                                  [(mount, ts, after, -freed, fs) for ts, after, freed in learned[1] if freed < 0])
        self._saved[mount] = learned
