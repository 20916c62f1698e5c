"""A writer's pace learned from the writes of a day (detectors.staircase.remember), where the forecast window
holds a few: remembered across fits and restarts (the state database), counted on only where the window's
writes agree with them, and only ever to warn earlier."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard.detectors import forecast, staircase
from trainguard.detectors.follow import learned, seeded
from trainguard.detectors.steps import Step
from trainguard.detectors.trend import GAP, fill_trend, window_writes
from trainguard.store.cycles import LearnedCycles, read_learned

from tests.support import fill_props as fp
from tests.support.plain_fit import plain_warnings

H, GB, STEP = 3600.0, 1e9, fp.STEP
SIZE = 1800 * GB


def staircase_disk(writes: list[tuple[float, float]], free: float, background: float) -> tuple[tuple[float, ...], float]:
    """Free bytes every STEP: a 60 s write of each (start, nbytes), `background` bytes/s besides, until
    full; and when it is full."""
    avail, t, k = [], 0.0, 0
    while free > 0:
        avail.append(free)
        while k < len(writes) and writes[k][0] + 60 <= t:
            k += 1
        free -= background * STEP + (writes[k][1] * STEP / 60 if k < len(writes) and writes[k][0] <= t else 0.0)
        t += STEP
    return tuple(avail), t


def slow_stretch(seed: int) -> list[tuple[float, float]]:
    """35 GB saves every 84 min, both +-20 % (epochs of uneven length), and from 17 h three long epochs
    in a row (1.9 h each) of smaller saves (24 GB): the window's pace drops to half the writer's."""
    import random
    rng = random.Random(seed)
    out, t = [], 0.5 * H
    while t < 60 * H:
        slow = 17 * H <= t < 17 * H + 3 * 2.0 * H
        out.append((t, (22 if slow else 35 * rng.uniform(0.5, 1.5)) * GB))
        t += 2.0 * H if slow else 1.4 * H * rng.uniform(0.5, 1.5)
    return out


@pytest.mark.parametrize("down", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_slow_stretch_of_saves_is_warned_six_hours_ahead_by_the_pace_of_the_day(seed, down):
    """Three long epochs of small saves leave the window a pace half the writer's: by the window alone the
    disk reads hours further from full than it is, and a warning on from 14 h before full went off until
    2.4-3.1 h before (as on a hold-out staircase). The writes of the day say the pace: the warning stays on
    from then to full, no later than the plain line through the window warns; across a restart in the slow
    stretch too, the writes read back from the state database (without them: 4.1 h)."""
    avail, full = staircase_disk(slow_stretch(seed), 720 * GB, 3.5 * GB / H)
    assert 25 * H < full < 28 * H  # the slow stretch (17-22.7 h) covers the last 10-6 h before full
    downtime = ((22.0 * H, 22.1 * H),) if down else ()  # a restart when the window holds only slow saves
    trace = fp.Trace("slow stretch", SIZE, avail, fp.Noise(5e7), seed=0, full_at=full, downtime=downtime)
    run = fp.replay(trace)
    since = run.warned_since()
    assert since is not None and full - since >= 6 * H, (full - since) / H if since else None
    pts = [(t, v) for t, _, v in trace.samples()]
    plain = [t for t, warns in zip(run.times, plain_warnings(pts, run.times, fp.CFG.window, fp.CFG.warning,
                                                             fp.CFG.evidence_ratio)) if warns]
    assert since <= plain[0] + fp.REFIT_SLACK


def step(start: float, nbytes: float) -> Step:
    return Step(start, start + 60.0, nbytes)


def window_of(found: list[Step], free: float, background: float, end: float) -> list[tuple[float, float]]:
    """10 s samples of the window the steps were found in."""
    pts, t = [], found[0].start - 1800.0
    level = free + sum(s.nbytes for s in found) + background * (end - t)
    while t <= end:
        level -= background * STEP + sum(s.nbytes / 6 for s in found if s.start <= t < s.end)
        pts.append((t, level))
        t += STEP
    return pts


def test_a_writer_whose_saves_halved_is_not_judged_by_the_day_before():
    """Saves of 20 GB every hour where the day before wrote 40 GB every hour: another writer (or the same
    one, changed), by far more than the window's few writes scatter. The day before says nothing of it."""
    found = [step(20 * H + k * H, 20 * GB) for k in range(5)]
    pts = window_of(found, 300 * GB, 0.0, found[-1].start + 0.5 * H)
    before = tuple(staircase.Write(k * H, 40 * GB, H if k else 0.0) for k in range(20))
    alone = staircase.stepped_eta(pts, found, 0.0, 20 * GB / H, pts[-1][0])
    assert staircase.stepped_eta(pts, found, 0.0, 20 * GB / H, pts[-1][0], before) == alone


def test_a_writer_known_for_a_day_is_not_warned_on_the_scatter_of_a_window_of_its_writes():
    """Bursts of 5.5 GB every 1.3 h, both +-40 %, and 0.64 GB/h besides, on a disk 10 h from full at that
    pace. The window's four writes alone leave the mean pace uncertain by a fifth, and at 2.5 of their
    errors the earliest ETA reads 6.1 h: warned. The day's writes, the same writer's, know that mean
    three times as well: the window's pace run forward with that error reads 7 h or more, and no warning
    (the central ETA and the plain line: 10 h). Without them the window's bound stands."""
    cfg = fp.CFG
    # Before the window, as remembered: (start h, GB, hours since the write before; 0 where not watched).
    before = [(0.16, 6.6, 0.0), (1.67, 4.4, 1.51), (4.76, 4.5, 0.0), (6.24, 7.1, 1.48), (7.16, 4.9, 0.92),
              (8.59, 6.7, 1.43), (9.69, 5.9, 1.10)]
    window = [(11.21, 6.6), (12.66, 3.7), (13.59, 5.2), (15.16, 6.4)]
    background, now = 0.64 * GB / H, 15.7 * H
    day = [(t * H, v * GB) for t, v, _ in before] + [(t * H, v * GB) for t, v in window]
    avail, _ = staircase_disk(day, 50.7 * GB + sum(v for _, v in day) + background * now, background)
    pts = [(k * STEP, v) for k, v in enumerate(avail) if now - cfg.window <= k * STEP <= now]
    known = [staircase.Write(t * H, v * GB, after * H) for t, v, after in before]
    alone = fill_trend(pts, SIZE, now, cfg.window, cfg.min_span)
    both = fill_trend(pts, SIZE, now, cfg.window, cfg.min_span, remembered=known)
    assert alone.eta_early < 6.2 * H and forecast.level(alone, cfg) is not None
    assert both.eta_early > 7 * H and forecast.level(both, cfg) is None
    assert both.eta <= alone.eta and pts[-1][1] / both.slope > 9.5 * H


def test_writes_are_remembered_a_day_with_the_intervals_seen_and_not_across_a_gap():
    pts = [(t, 100 * GB) for t in range(0, 4 * 3600, 10) if not 7000 <= t < 9000]  # down 33 min
    found = [step(1000.0, GB), step(4600.0, GB), step(10000.0, GB)]
    seen = staircase.seen(pts, found, GAP)
    assert [w.after for w in seen] == [0.0, 3600.0, 0.0]  # the third came after the gap: its interval unknown
    # Seen again a bucket later (its samples averaged), a write keeps the interval known for it.
    again = staircase.remember(seen, (staircase.Write(4700.0, 1.1 * GB, 0.0),), 5 * H)
    assert [(w.start, w.after) for w in again] == [(1000.0, 0.0), (4700.0, 3600.0), (10000.0, 0.0)]
    assert staircase.remember(again, (), 1000.0 + 24 * H + 1) == again[1:]  # a day on, the first is forgotten
    assert staircase.remember(again, (), 4000.0) == again[:1]  # none after now (the clock went back)


def test_a_fall_across_downtime_is_not_remembered_as_one_write():
    # 5 GB saves every hour and 1 GB/h besides; the daemon was down from 2.8 h to 3.9 h, and the save at
    # 3.5 h came while it was. The fall across the gap is all that was written while down: remembered as
    # one write, 0.3 h after the one before it (the last sample before the gap), it made the writer's pace
    # look faster than it is, and a disk 11 h from full at that pace was warned "earliest in 6 h".
    avail, _ = staircase_disk([(k * H + 0.5 * H, 5 * GB) for k in range(6)], 200 * GB, GB / H)
    pts = [(k * STEP, v) for k, v in enumerate(avail) if k * STEP <= 6 * H and not 2.8 * H <= k * STEP < 3.9 * H]
    found, _ = window_writes(pts, SIZE)
    assert [round(s.nbytes / GB, 1) for s in found] == [5.0, 5.0, 5.0, 6.1, 5.0, 5.0]
    remembered = staircase.seen(pts, found, GAP)
    assert [round(w.start / H, 1) for w in remembered] == [0.5, 1.5, 2.5, 4.5, 5.5]
    assert [w.after for w in remembered] == [0.0, H, H, 0.0, H]


def test_remembered_writes_survive_a_restart_beside_the_cycles(tmp_path):
    rows = ((1000.0, 0.0, -30 * GB), (5000.0, 4000.0, -31 * GB), (6000.0, 20 * GB, 50 * GB))
    fit = seeded(rows)
    assert len(fit.cycles) == 1 and [w.nbytes for w in fit.writes] == [30 * GB, 31 * GB]
    store = LearnedCycles(sqlite3.connect(tmp_path / "state.db", isolation_level=None))
    store.save("/data", learned(fit), 2 * H)
    again = LearnedCycles(sqlite3.connect(tmp_path / "state.db", isolation_level=None))
    assert again.load(2 * H) == {"/data": rows}
    assert seeded(again.load(2 * H)["/data"]) == fit


@settings(max_examples=200, deadline=None, derandomize=True)
@given(sizes=st.lists(st.floats(5, 60), min_size=4, max_size=8), gaps=st.lists(st.floats(0.5, 2.5), min_size=8, max_size=8),
       before=st.lists(st.tuples(st.floats(5, 60), st.floats(0.5, 2.5)), min_size=1, max_size=20),
       free=st.floats(100, 800))
def test_writes_remembered_only_ever_bring_the_forecast_earlier(sizes, gaps, before, free):
    """Whatever the day before wrote: the ETA is no later than the window's own, or than its rate's line
    where its few writes alone read as bursts, and neither is the earliest credible one (the day's writes
    may tell the writer's pace more exactly, never slower); and a forecast the window has is never lost."""
    t, found = 30 * H, []
    for size, gap in zip(sizes, gaps):
        found.append(step(t, size * GB))
        t += gap * H
    pts = window_of(found, free * GB, 0.0, found[-1].start + 0.5 * H)
    rate = sum(s.nbytes for s in found) / (found[-1].start - found[0].start)
    alone = staircase.stepped_eta(pts, found, 0.0, rate, pts[-1][0])
    t, known = found[0].start, []
    for size, gap in reversed(before):
        t -= gap * H
        known.append(staircase.Write(t, size * GB, gap * H))
    both = staircase.stepped_eta(pts, found, 0.0, rate, pts[-1][0], sorted(known, key=lambda w: w.start))
    assert alone is None or both is not None
    if both is not None:
        # Where the window's few writes alone read as bursts, the trend is the line at the window's rate.
        line = pts[-1][1] / rate
        assert both.early <= both.eta <= (alone.eta if alone else line)


def test_a_database_without_the_writes_table_still_gives_its_cycles(tmp_path):
    """`trainguard status` reads the state database as it finds it, read-only: one an older version wrote
    has no table of writes, and its cleanup cycles still count."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE forecast_cycles (mount TEXT NOT NULL, ts REAL NOT NULL, low REAL NOT NULL, "
                 "freed REAL NOT NULL, fs TEXT NOT NULL DEFAULT '', PRIMARY KEY (mount, ts)) WITHOUT ROWID")
    conn.execute("INSERT INTO forecast_cycles VALUES ('/data', 1000.0, 20e9, 50e9, '')")
    conn.close()
    read_only = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert read_learned(read_only, 2 * H) == {"/data": ("", ((1000.0, 20e9, 50e9),))}
