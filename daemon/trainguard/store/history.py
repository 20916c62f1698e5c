"""Recent samples, kept in memory for the detectors and in SQLite across restarts.

Every cycle the daemon records a handful of named series ("fs.avail_bytes:/data",
"disk.util:sda", "gpu.util:0"). Detectors read them back through points().

Memory is bounded: full resolution for the last `fine_window` seconds, then one
averaged point per `bucket` seconds up to `window`. The database is bounded too:
raw rows for `raw_retention`, `rollup`-second averages up to `retention`, then
pruned; compact() keeps its size flat over weeks.
"""

from __future__ import annotations

import bisect
import logging
import math
import sqlite3
from array import array
from typing import Iterable, Mapping

log = logging.getLogger(__name__)

# Rows are keyed time first: a cycle's rows all land at the end of one B-tree, a page or two, where a
# series-first key put each series' new row on a page of its own: 190 series dirtied 190 pages (760 KiB
# through the WAL) per cycle, 2.3 ms of CPU, 9x the time-first cost. Every read is by time too (the
# window on start-up, the 24 h use in `status`, roll-ups and pruning).
POINTS = """(series_id INTEGER NOT NULL, ts REAL NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (ts, series_id)) WITHOUT ROWID"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS samples {POINTS};
CREATE TABLE IF NOT EXISTS rollups {POINTS};
"""


def _time_first(conn: sqlite3.Connection) -> None:
    """Rewrite tables a previous version keyed series first (once; a few seconds for weeks of rows).
    One that cannot be rewritten now (a full disk) stays as it is: it works, at the old cost."""
    for table in ("samples", "rollups"):
        key = [name for _, name, *_rest, pk in conn.execute(f"PRAGMA table_info({table})") if pk == 1]
        if key != ["series_id"]:
            continue
        try:
            with conn:
                conn.execute("BEGIN")
                conn.execute(f"CREATE TABLE {table}_by_time {POINTS}")
                conn.execute(f"INSERT INTO {table}_by_time SELECT series_id, ts, value FROM {table}")
                conn.execute(f"DROP TABLE {table}")
                conn.execute(f"ALTER TABLE {table}_by_time RENAME TO {table}")
        except sqlite3.Error as exc:
            log.warning("history table %s keeps its old layout for now (%s): each cycle's write costs more", table,
                        exc)


class _Series:
    """Points of one series: fine (raw) tail, coarse (bucket means) before it."""

    __slots__ = ("fine_ts", "fine_v", "coarse_ts", "coarse_v", "coarse_n")

    def __init__(self) -> None:
        self.fine_ts, self.fine_v = array("d"), array("d")
        self.coarse_ts, self.coarse_v, self.coarse_n = array("d"), array("d"), array("l")

    def add(self, ts: float, value: float, fine_window: float, bucket: float, window: float) -> None:
        if self.fine_ts and ts <= self.fine_ts[-1]:
            self.drop_from(ts)  # the wall clock went back: what was recorded "after" ts is void
        self.fine_ts.append(ts)
        self.fine_v.append(value)
        cut = 0
        while cut < len(self.fine_ts) and self.fine_ts[cut] < ts - fine_window:
            self._to_coarse(self.fine_ts[cut], self.fine_v[cut], bucket)
            cut += 1
        if cut:
            del self.fine_ts[:cut], self.fine_v[:cut]
        drop = 0
        while drop < len(self.coarse_ts) and self.coarse_ts[drop] < ts - window:
            drop += 1
        if drop:
            del self.coarse_ts[:drop], self.coarse_v[:drop], self.coarse_n[:drop]

    def drop_from(self, ts: float) -> None:
        """Forget points at or after ts, so the series stays ordered and keeps recording."""
        keep = bisect.bisect_left(self.fine_ts, ts)
        del self.fine_ts[keep:], self.fine_v[keep:]
        keep = bisect.bisect_left(self.coarse_ts, ts)
        del self.coarse_ts[keep:], self.coarse_v[keep:], self.coarse_n[keep:]

    def _to_coarse(self, ts: float, value: float, bucket: float) -> None:
        # A bucket point sits at the mean time of its samples, not at the bucket start: stamped at the
        # start, every averaged point would look half a bucket older and bias each fitted slope.
        if self.coarse_ts and math.floor(self.coarse_ts[-1] / bucket) == math.floor(ts / bucket):
            n = self.coarse_n[-1]
            self.coarse_v[-1] += (value - self.coarse_v[-1]) / (n + 1)
            self.coarse_ts[-1] += (ts - self.coarse_ts[-1]) / (n + 1)
            self.coarse_n[-1] = n + 1
        else:
            self.coarse_ts.append(ts)
            self.coarse_v.append(value)
            self.coarse_n.append(1)

    def points(self, since: float) -> list[tuple[float, float]]:
        # Bisected: a carried fit reads only the few samples since its last full fit.
        lo = bisect.bisect_left(self.coarse_ts, since)
        out = list(zip(self.coarse_ts[lo:], self.coarse_v[lo:]))
        lo = bisect.bisect_left(self.fine_ts, since)
        out.extend(zip(self.fine_ts[lo:], self.fine_v[lo:]))
        return out

    def last(self) -> tuple[float, float] | None:
        if self.fine_ts:
            return self.fine_ts[-1], self.fine_v[-1]
        if self.coarse_ts:
            return self.coarse_ts[-1], self.coarse_v[-1]
        return None


class History:
    """conn=None keeps everything in memory only (used by `trainguard status`)."""

    def __init__(
        self,
        conn: sqlite3.Connection | None,
        *,
        window: float = 6 * 3600.0,
        fine_window: float = 900.0,
        bucket: float = 60.0,
        raw_retention: float = 24 * 3600.0,
        retention: float = 14 * 86400.0,
        rollup: float = 300.0,
        now: float | None = None,
    ):
        self.conn = conn
        self.window = max(window, fine_window)
        self.fine_window = fine_window
        self.bucket = bucket
        self.raw_retention = raw_retention
        self.retention = retention
        self.rollup = rollup
        self._series: dict[str, _Series] = {}
        self._ids: dict[str, int] = {}
        self._last_ts: float | None = None
        if conn is not None:
            conn.executescript(SCHEMA)
            _time_first(conn)
            if now is not None:
                self.load(conn, now)

    @classmethod
    def from_config(cls, conn: sqlite3.Connection | None, config, now: float) -> "History":
        """Memory window sized for the longest detector window in the config."""
        gpu = config.gpu
        stall_for = max([gpu.for_] + [o.for_ for o in gpu.overrides if o.for_ is not None])
        # A firing stall looks back 6 x `for` to tell since when the GPU has been idle.
        window = max(config.forecast.window, config.io.for_, 6 * stall_for, gpu.throttle_for, gpu.xid_hold)
        return cls(
            conn,
            window=window,
            raw_retention=max(config.history.raw_retention, window),
            retention=config.history.retention,
            rollup=config.history.rollup,
            now=now,
        )

    def load(self, conn: sqlite3.Connection, now: float) -> None:
        """Warm the in-memory series from a database, so a restart keeps the trend."""
        since = now - self.window
        try:
            names = {i: n for i, n in conn.execute("SELECT id, name FROM series")}
        except sqlite3.OperationalError:  # a database without history tables
            return
        if conn is self.conn:
            self._ids = {n: i for i, n in names.items()}
        rows = conn.execute(
            "SELECT series_id, ts, value FROM rollups WHERE ts >= ? "
            "UNION ALL SELECT series_id, ts, value FROM samples WHERE ts >= ? ORDER BY 2",
            (since, since),
        )
        for series_id, ts, value in rows:
            name = names.get(series_id)
            if name is not None:
                self._add(name, ts, value)
                if conn is self.conn:
                    self._last_ts = ts if self._last_ts is None else max(self._last_ts, ts)

    def _add(self, name: str, ts: float, value: float) -> None:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = _Series()
        series.add(ts, value, self.fine_window, self.bucket, self.window)

    def _id(self, name: str) -> int:
        series_id = self._ids.get(name)
        if series_id is None:
            self.conn.execute("INSERT OR IGNORE INTO series(name) VALUES (?)", (name,))
            series_id = self.conn.execute("SELECT id FROM series WHERE name = ?", (name,)).fetchone()[0]
            self._ids[name] = series_id
        return series_id

    def record(self, ts: float, values: Mapping[str, float | None]) -> None:
        """Add one point per series; None values (not measured) are skipped."""
        present = [(n, float(v)) for n, v in values.items() if v is not None and not math.isnan(v)]
        if self._last_ts is not None and ts < self._last_ts:
            # Stepped back (NTP, date -s): samples stamped after ts would sit "in the future" and
            # block or scramble every series until the clock caught up. They are dropped.
            log.warning("wall clock went back %.0f s; dropping history recorded after the new time",
                        self._last_ts - ts)
            for series in self._series.values():
                series.drop_from(ts)
            if self.conn is not None:
                with self.conn:
                    self.conn.execute("BEGIN")
                    self.conn.execute("DELETE FROM samples WHERE ts >= ?", (ts,))
                    self.conn.execute("DELETE FROM rollups WHERE ts >= ?", (ts,))
        self._last_ts = ts
        for name, value in present:
            self._add(name, ts, value)
        if self.conn is None or not present:
            return
        try:
            with self.conn:
                self.conn.execute("BEGIN")
                self.conn.executemany(
                    "INSERT OR REPLACE INTO samples(series_id, ts, value) VALUES (?, ?, ?)",
                    [(self._id(n), ts, v) for n, v in present],
                )
        except sqlite3.Error:
            # Rolled back (a full disk): ids of series inserted in this transaction no longer exist.
            # The points stay in memory, so detection goes on; only their copy on disk is missing.
            self._ids.clear()
            raise

    def points(self, name: str, since: float) -> list[tuple[float, float]]:
        series = self._series.get(name)
        return series.points(since) if series else []

    def latest(self, name: str) -> tuple[float, float] | None:
        series = self._series.get(name)
        return series.last() if series else None

    def names(self, prefix: str = "") -> Iterable[str]:
        return [n for n in self._series if n.startswith(prefix)]

    def compact(self, now: float) -> None:
        """Roll raw rows older than raw_retention into averages; prune beyond retention."""
        if self.conn is None:
            return
        # Cut on a rollup boundary so each rollup bucket is averaged once, from all its rows.
        raw_cut = math.floor((now - self.raw_retention) / self.rollup) * self.rollup
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute(
                "INSERT OR REPLACE INTO rollups(series_id, ts, value) "
                "SELECT series_id, CAST(ts / ?1 AS INTEGER) * ?1, AVG(value) FROM samples "
                "WHERE ts < ?2 GROUP BY series_id, CAST(ts / ?1 AS INTEGER)",
                (self.rollup, raw_cut),
            )
            self.conn.execute("DELETE FROM samples WHERE ts < ?", (raw_cut,))
            self.conn.execute("DELETE FROM rollups WHERE ts < ?", (now - self.retention,))
            # Series of mounts that went away long ago.
            self.conn.execute(
                "DELETE FROM series WHERE id NOT IN (SELECT series_id FROM samples) "
                "AND id NOT IN (SELECT series_id FROM rollups)"
            )
        self._ids = dict(self.conn.execute("SELECT name, id FROM series"))
        for name in [n for n in self._series if n not in self._ids and self._series[n].last()[0] < now - self.window]:
            del self._series[name]
