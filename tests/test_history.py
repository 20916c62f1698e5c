"""History: detectors see recent samples, a restart keeps the trend, and the database stays bounded."""

from __future__ import annotations

import logging
import os
import sqlite3

import pytest
from trainguard import config as configmod
from trainguard.store.history import History
from trainguard.store.state import DB_NAME, SCHEMA, StateDb, read_only

T0 = 1_700_000_000.0


def db_bytes(state_dir) -> int:
    return sum(os.path.getsize(os.path.join(state_dir, DB_NAME + s))
               for s in ("", "-wal") if os.path.exists(os.path.join(state_dir, DB_NAME + s)))


def test_points_latest_and_unmeasured_values():
    h = History(None)
    h.record(T0, {"fs.avail_bytes:/data": 100, "fs.inodes_used_ratio:/data": None})
    h.record(T0 + 10, {"fs.avail_bytes:/data": 90, "disk.util:sda": float("nan")})
    assert h.points("fs.avail_bytes:/data", T0 + 5) == [(T0 + 10, 90.0)]
    assert h.latest("fs.avail_bytes:/data") == (T0 + 10, 90.0)
    assert h.points("fs.inodes_used_ratio:/data", 0) == [] and h.latest("disk.util:sda") is None
    assert list(h.names("fs.")) == ["fs.avail_bytes:/data"]


def test_memory_keeps_full_resolution_recently_and_averages_before():
    h = History(None, window=3600, fine_window=600, bucket=60)
    for i in range(3 * 360):  # 3 h at 10 s
        h.record(T0 + 10 * i, {"s": float(i)})
    now = T0 + 10 * (3 * 360 - 1)
    pts = h.points("s", 0)
    assert pts[0][0] >= now - 3600, "nothing older than the window is kept"
    assert len(pts) <= 600 / 10 + 3600 / 60 + 2
    fine = [p for p in pts if p[0] >= now - 600]
    assert len(fine) == 61 and fine[-1] == (now, 1079.0)
    coarse = [p for p in pts if p[0] < now - 600]
    assert len(coarse) >= (3600 - 600) // 60
    for ts, value in coarse:  # a bucket's point is the mean time and value of the samples that fell in it
        start = (ts // 60) * 60
        members = [i for i in range(3 * 360) if start <= T0 + 10 * i < min(start + 60, now - 600)]
        assert value == pytest.approx(sum(members) / len(members))
        assert ts == pytest.approx(T0 + 10 * sum(members) / len(members))


def test_a_restart_keeps_the_trend(tmp_path):
    db = StateDb(str(tmp_path))
    h = History(db.connect(), window=3600, now=T0)
    for i in range(360):
        h.record(T0 + 10 * i, {"fs.avail_bytes:/data": 1e9 - i * 1e6})
    now = T0 + 3590
    h2 = History(StateDb(str(tmp_path)).connect(), window=3600, now=now)
    assert h2.points("fs.avail_bytes:/data", now - 600) == h.points("fs.avail_bytes:/data", now - 600)
    assert len(h2.points("fs.avail_bytes:/data", 0)) > 60


def test_status_reads_a_running_daemons_database_read_only(tmp_path):
    db = StateDb(str(tmp_path))
    writer = History(db.connect(), now=T0)
    writer.record(T0, {"fs.avail_bytes:/": 5.0})
    conn = read_only(str(tmp_path))
    reader = History(None)
    reader.load(conn, T0 + 1)
    assert reader.latest("fs.avail_bytes:/") == (T0, 5.0)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM samples")
    assert read_only(str(tmp_path / "nowhere")) is None


def test_a_wall_clock_step_back_does_not_stop_recording(caplog):
    h = History(None)
    for i in range(10):
        h.record(T0 + 10 * i, {"s": float(i)})
    back = T0 + 90 - 3600  # NTP stepped the clock back an hour
    with caplog.at_level(logging.WARNING):
        for i in range(5):
            h.record(back + 10 * i, {"s": 100.0 + i})
    assert h.latest("s") == (back + 40, 104.0), "new samples are kept"
    pts = h.points("s", 0)
    assert pts == sorted(pts) and all(t <= back + 40 for t, _ in pts), "no samples left 'in the future'"
    assert "clock" in caplog.text


def test_the_database_stays_flat_over_weeks(tmp_path):
    """Two weeks of 1-minute samples with a fake clock: after the retention fills, the size stops growing."""
    db = StateDb(str(tmp_path))
    day = 86400
    h = History(db.connect(), window=3600, raw_retention=6 * 3600, retention=3 * day, rollup=300, now=T0)
    sizes, rows = {}, {}
    mounts = [f"/mnt/m{i}" for i in range(4)]
    ts = T0
    for minute in range(14 * 24 * 60):
        ts = T0 + 60 * minute
        values = {f"fs.avail_bytes:{m}": 1e12 - minute * 1e6 for m in mounts}
        values.update({f"disk.util:sd{i}": 0.5 for i in range(4)})
        if minute < 2 * 24 * 60:
            values["fs.avail_bytes:/mnt/gone"] = 1.0  # a mount removed after two days
        h.record(ts, values)
        if minute % 60 == 59:  # the daemon compacts hourly
            h.compact(ts)
        if minute % (24 * 60) == 24 * 60 - 1:
            d = minute // (24 * 60) + 1
            sizes[d] = db_bytes(tmp_path)
            rows[d] = h.conn.execute("SELECT (SELECT COUNT(*) FROM samples) + (SELECT COUNT(*) FROM rollups)"
                                     ).fetchone()[0]
    assert rows[14] <= rows[5], rows  # rows stop growing once raw and rollup retention are full
    assert sizes[14] <= sizes[5] * 1.1, sizes
    assert sizes[14] < 8 * 2**20, sizes
    oldest = h.conn.execute("SELECT MIN(ts) FROM rollups").fetchone()[0]
    assert oldest >= ts - 3 * day - 300
    names = {n for (n,) in h.conn.execute("SELECT name FROM series")}
    assert "fs.avail_bytes:/mnt/gone" not in names and "fs.avail_bytes:/mnt/gone" not in h.names()
    assert len(h.points("fs.avail_bytes:/mnt/m0", ts - 3600)) >= 59


def test_rollups_average_what_they_replace(tmp_path):
    t0 = 472_222 * 3600.0  # on a rollup boundary
    h = History(StateDb(str(tmp_path)).connect(), raw_retention=600, retention=86400, rollup=300, now=t0)
    for i in range(180):  # 30 min at 10 s, value = minute
        h.record(t0 + 10 * i, {"s": float(i // 6)})
    h.compact(t0 + 1800)
    rolled = h.conn.execute("SELECT ts, value FROM rollups ORDER BY ts").fetchall()
    raw_left = h.conn.execute("SELECT MIN(ts) FROM samples").fetchone()[0]
    assert rolled == [(t0, 2.0), (t0 + 300, 7.0), (t0 + 600, 12.0), (t0 + 900, 17.0)]  # means of 5 minutes each
    assert raw_left == t0 + 1200, "raw rows kept for raw_retention, cut on a rollup boundary"
    h.compact(t0 + 1800)
    assert h.conn.execute("SELECT ts, value FROM rollups ORDER BY ts").fetchall() == rolled, "idempotent"


def test_window_covers_the_longest_detector_window():
    cfg = configmod.parse({"forecast": {"window": "1h", "min_span": "10m"}, "io": {"for": "3h"}}, "test")
    h = History.from_config(None, cfg, T0)
    for i in range(4 * 360):
        h.record(T0 + 10 * i, {"disk.util:sda": 1.0})
    now = T0 + 10 * (4 * 360 - 1)
    assert h.points("disk.util:sda", 0)[0][0] <= now - 3 * 3600 + 60


def test_corrupt_database_is_moved_aside_and_a_fresh_one_started(tmp_path, caplog):
    path = tmp_path / DB_NAME
    path.write_bytes(b"this is not a database" * 500)
    with caplog.at_level(logging.WARNING):
        db = StateDb(str(tmp_path))
    assert "moved it to" in caplog.text and str(path) in caplog.text
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(DB_NAME + ".corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    h = History(db.connect(), now=T0)
    h.record(T0, {"s": 1.0})
    assert History(StateDb(str(tmp_path)).connect(), now=T0).latest("s") == (T0, 1.0)


def test_damaged_pages_are_detected(tmp_path, caplog):
    db = StateDb(str(tmp_path))
    h = History(db.connect(), now=T0)
    h.record(T0, {f"s{i}": float(i) for i in range(2000)})
    h.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    h.conn.close()
    path = tmp_path / DB_NAME
    data = bytearray(path.read_bytes())
    for offset in range(4096 + 64, len(data), 4096):  # scribble over every page after the first
        data[offset:offset + 256] = os.urandom(256)
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        db = StateDb(str(tmp_path))
    assert "unusable" in caplog.text
    History(db.connect(), now=T0).record(T0 + 1, {"s": 1.0})


def test_a_one_off_command_checks_the_header_and_schema_only(tmp_path, caplog):
    """`cleanup` and `mirror` open the database with check=SCHEMA: garbage is moved aside as at the
    daemon's start, a good file of any size is taken without reading every page."""
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 500)
    with caplog.at_level(logging.WARNING):
        db = StateDb(str(tmp_path), check=SCHEMA)
    assert "moved it to" in caplog.text
    History(db.connect(), now=T0).record(T0, {"s": 1.0})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = StateDb(str(tmp_path), check=SCHEMA)
    assert not caplog.text and History(again.connect(), now=T0).latest("s") == (T0, 1.0)


def test_an_unopenable_database_is_moved_aside(tmp_path, caplog):
    (tmp_path / DB_NAME).mkdir()  # not a file at all
    with caplog.at_level(logging.WARNING):
        db = StateDb(str(tmp_path))
    History(db.connect(), now=T0).record(T0, {"s": 1.0})
    assert (tmp_path / DB_NAME).is_file()


def test_a_daemon_restarted_often_still_compacts(tmp_path):
    """Compaction ran only after an hour of uptime: restarted every 30 minutes, the database never shrank."""
    from tests.support.clock import FakeClock
    from tests.support.fake_daemon import FakeDisk, Recorder, daemon

    clock, disk = FakeClock(), FakeDisk()
    sections = {"history": {"raw_retention": "1h", "retention": "1d"}, "forecast": {"window": "30m",
                                                                                    "min_span": "5m"}}
    for restart in range(8):  # 4 hours, restarted every 30 minutes
        d = daemon(tmp_path, clock, disk, Recorder(), sections)
        for _ in range(180):
            d.cycle()
            clock.advance(10)
        d.close()
    oldest_raw = sqlite3.connect(tmp_path / "state" / DB_NAME).execute("SELECT MIN(ts) FROM samples").fetchone()[0]
    assert oldest_raw >= clock.time() - 2 * 3600, "raw rows older than raw_retention were rolled up"


def test_memory_window_covers_the_longest_gpu_detector_window():
    from trainguard import config as configmod

    cfg = configmod.parse({"forecast": {"window": "1h", "min_span": "10m", "warning": "1h", "critical": "10m"},
                           "gpu": {"for": "20m", "throttle_for": "90m",
                                   "overrides": [{"match": "1", "for": "30m"}]}}, "test")
    history = History.from_config(None, cfg, now=0.0)
    assert history.window == 6 * 30 * 60  # a firing stall on GPU 1 looks back 6 x its 30 min `for`


def test_a_database_keyed_series_first_is_rewritten_time_first_with_every_row(tmp_path):
    """Rows are keyed (ts, series): a cycle's writes land on one or two pages. A database written by a
    version that keyed them (series, ts) is rewritten on start, keeping its history."""
    conn = StateDb(str(tmp_path)).connect()
    conn.executescript("""
        CREATE TABLE series (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
        CREATE TABLE samples (series_id INTEGER NOT NULL, ts REAL NOT NULL, value REAL NOT NULL,
            PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
        CREATE TABLE rollups (series_id INTEGER NOT NULL, ts REAL NOT NULL, value REAL NOT NULL,
            PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
        INSERT INTO series VALUES (1, 'a'), (2, 'b');""")
    conn.executemany("INSERT INTO samples VALUES (?, ?, ?)", [(i, T0 + 10 * k, k) for i in (1, 2) for k in range(50)])
    conn.execute("INSERT INTO rollups VALUES (1, ?, 7.0)", (T0 - 600,))
    h = History(conn, now=T0 + 500)
    for table in ("samples", "rollups"):
        key = sorted((pk, name) for _, name, *_, pk in conn.execute(f"PRAGMA table_info({table})") if pk)
        assert [name for _, name in key] == ["ts", "series_id"]
    assert conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 100
    assert h.points("b", 0)[-1] == (T0 + 490, 49.0) and h.points("a", 0)[0] == (T0 - 600, 7.0)
    h.record(T0 + 500, {"a": 1.0, "c": 2.0})
    assert History(StateDb(str(tmp_path)).connect(), now=T0 + 510).latest("c") == (T0 + 500, 2.0)
