"""The cleanup cycles the forecast learned: kept in the state database (store.cycles) for the longest
rhythm's four periods, handed back at start, over an unreadable sample and a reload; and the warm-up,
while the history covers less than a window."""

from __future__ import annotations

import sqlite3

from trainguard import config as configmod
from trainguard.detectors import DetectorInput, sawtooth
from trainguard.detectors.follow import learned, seeded
from trainguard.detectors.forecast import fill_trend, level
from trainguard.records import FsSample, FsUsage
from trainguard.store.cycles import LearnedCycles, identity, read, read_learned, same_filesystem
from trainguard.store.history import History
from trainguard.surfaces.status_text import _eta

from tests.support import traces
from tests.support.snapshots import mount, snapshot

H = 3600.0
DAY = 24 * H
GB = 1e9
CFG = configmod.parse({}, "test").forecast


def snapshot_usage(fsid: int) -> FsUsage:
    return FsUsage(100 * GB, 50 * GB, 50 * GB, 1000, 500, 500, fsid=fsid)


def daily(n: int, start: float = 0.0) -> tuple[sawtooth.Cycle, ...]:
    return tuple(sawtooth.Cycle(start + k * DAY, 8 * GB, 82 * GB) for k in range(n))


def test_cycles_round_trip_through_the_state_database(tmp_path):
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    store = LearnedCycles(conn)
    rows = learned(seeded([(c.ts, c.low, c.freed) for c in daily(3)]))
    store.save("/data", rows, 2 * DAY + H)
    store.save("/scratch", rows[:1], 2 * DAY + H)
    again = LearnedCycles(sqlite3.connect(tmp_path / "state.db", isolation_level=None))
    assert again.load(2 * DAY + H) == {"/data": rows, "/scratch": rows[:1]}
    assert read(conn, DAY + H)["/data"] == rows[:2]  # after a clock step back, none from "the future"
    store.save("/data", rows[1:], 3 * DAY)  # the forecast forgot the oldest: so does the table
    assert read(conn, 3 * DAY)["/data"] == rows[1:]


def test_cycles_an_older_version_saved_are_kept_and_taken_as_the_mounts_own(tmp_path):
    """A state db from before the filesystem's identity was saved: its rows are read, and counted on for
    whatever filesystem the mount shows (nothing tells them apart); the next save records the filesystem."""
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    conn.execute("CREATE TABLE forecast_cycles (mount TEXT NOT NULL, ts REAL NOT NULL, low REAL NOT NULL, "
                 "freed REAL NOT NULL, PRIMARY KEY (mount, ts)) WITHOUT ROWID")
    rows = learned(seeded([(c.ts, c.low, c.freed) for c in daily(2)]))
    conn.executemany("INSERT INTO forecast_cycles VALUES ('/data', ?, ?, ?)", rows)
    store = LearnedCycles(conn)
    assert store.load(DAY + H) == {"/data": rows} and store.learned_on == {"/data": ""}
    now_showing = FsSample(mount("/data"), DAY + H, snapshot_usage(fsid=0xABC))
    assert same_filesystem(read_learned(conn, DAY + H), [now_showing]) == {"/data": rows}
    store.save("/data", rows, DAY + H, identity(now_showing))
    assert read_learned(conn, DAY + H)["/data"] == (identity(now_showing), rows)
    other = FsSample(mount("/data"), DAY + H, snapshot_usage(fsid=0xDEF))
    assert same_filesystem(read_learned(conn, DAY + H), [other]) == {}


def test_an_unchanged_set_of_cycles_is_not_written_again(tmp_path):
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    store = LearnedCycles(conn)
    rows = learned(seeded([(c.ts, c.low, c.freed) for c in daily(2)]))
    store.save("/data", rows, DAY + H)
    changes = conn.total_changes
    store.save("/data", rows, DAY + 2 * H)
    assert conn.total_changes == changes


def test_a_daily_rhythm_is_kept_four_periods_and_a_single_cleanup_a_week():
    # Four: as the next cleanup is late, the three before it (two periods) are still there to judge by.
    cycles = daily(3)
    assert sawtooth.merge(cycles, (), 2 * DAY + 23 * H) == cycles  # a 24 h memory lost the first here
    assert sawtooth.merge(cycles, (), 4 * DAY - H) == cycles
    assert sawtooth.merge(cycles, (), 4 * DAY + H) == cycles[1:]
    one = daily(1)
    assert sawtooth.merge(one, (), 6 * DAY) == one
    assert sawtooth.merge(one, (), 7 * DAY + H) == ()


def test_an_unreadable_sample_keeps_the_learned_cycles():
    history = History(None, window=CFG.window)
    cfg = configmod.parse({}, "test")
    unreadable = FsSample(mount("/data"), 2 * DAY, None, error="Input/output error")
    inp = DetectorInput(cfg, history, snapshot(unreadable, ts=2 * DAY), 2 * DAY,
                        fits={"/data": seeded(learned(seeded([(c.ts, c.low, c.freed) for c in daily(2)])))})
    assert inp.trend(unreadable) is None
    assert inp.fits["/data"].cycles == daily(2)


def test_a_churn_seen_from_a_fresh_start_is_learning_not_alerted():
    # A GC between 85 and 97 % used, the daemon started with it: once one cleanup is in sight, near the
    # low the writer's pace says "full in 1 h". Not one period of it has been seen: shown, not alerted on.
    # (Before that first cleanup it is a fill with no deletion in sight, which may be warned of.)
    process = traces.gc_churn(0.85, 0.97, seed=3)
    pts = process.sample(0, 6 * H)
    first = next(t for (_, a), (t, b) in zip(pts, pts[1:]) if b > a + 0.01 * process.size)
    quiet = 0
    for now in range(int(first) + 600, int(5.5 * H), 300):
        trend = fill_trend(process.sample(0, now), process.size, now, CFG.window, CFG.min_span)
        assert trend.learning and level(trend, CFG) is None, now / H
        quiet += trend.quiet and trend.eta < CFG.warning
    assert quiet  # it did say "full in < 6 h" meanwhile


def test_a_fill_with_no_deletion_in_sight_is_alerted_while_learning():
    process = traces.steady(rate_per_h=30 * traces.GiB, start_free=150 * traces.GiB)  # full at 5 h
    trend = fill_trend(process.sample(0, 3 * H), process.size, 3 * H, CFG.window, CFG.min_span)
    assert trend.learning and not trend.quiet
    assert level(trend, CFG) is not None


def test_status_says_learning():
    assert _eta({"forecast_learning": True, "eta_seconds": None}, str) == "learning"
    assert _eta({"forecast_learning": True, "eta_seconds": 7200}, str) == "2h (learning)"
    assert _eta({"forecast_learning": False, "eta_seconds": 7200}, str) == "2h"
