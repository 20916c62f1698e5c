"""Alert lifecycle: pending -> firing -> resolved, repeats, dedup, no storms, and memory across restarts."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter

from trainguard.alerts.lifecycle import FIRING, PENDING, Lifecycle
from trainguard.records import AlertStatus, Finding, Severity
from trainguard.store.state import StateDb

from tests.support.clock import FakeClock
from tests.support.fake_daemon import FakeDisk, Recorder, daemon

T0 = 1_700_000_000.0
H = 3600.0


def finding(key="fs.usage:/data", severity=Severity.WARNING, for_s=0.0, summary=None):
    return Finding(key=key, severity=severity, summary=summary or f"{key} {severity.value}", for_s=for_s)


def lifecycle(conn=None, repeat=4 * H, keep=60.0):
    return Lifecycle(conn, repeat_interval=repeat, keep_firing_for=keep)


def drive(lc, seconds, step, findings_at):
    """Call update every `step` seconds for `seconds`; findings_at(t) gives the findings at offset t."""
    events = []
    t = 0.0
    while t <= seconds:
        events.extend((t, e) for e in lc.update(findings_at(t), T0 + t))
        t += step
    return events


def kinds(events):
    return [(t, e.status.value + (" repeat" if e.repeat else ""), e.finding.severity.value) for t, e in events]


def test_fires_at_once_without_for():
    lc = lifecycle()
    (e,) = lc.update([finding()], T0)
    assert e.status is AlertStatus.FIRING and e.started_at == T0 and not e.repeat
    assert lc.update([finding()], T0 + 10) == []


def test_pending_until_for_has_passed():
    lc = lifecycle()
    events = drive(lc, 400, 10, lambda t: [finding(for_s=300)])
    assert kinds(events) == [(300, "firing", "warning")]
    assert events[0][1].started_at == T0 + 300


def test_a_pending_alert_that_goes_away_is_never_sent():
    lc = lifecycle()
    events = drive(lc, 600, 10, lambda t: [finding(for_s=300)] if t < 200 else [])
    assert events == [] and lc.states == {}


def test_repeats_every_repeat_interval_while_firing():
    lc = lifecycle()
    events = drive(lc, 10 * H, 60, lambda t: [finding()])
    assert kinds(events) == [(0, "firing", "warning"), (4 * H, "firing repeat", "warning"),
                             (8 * H, "firing repeat", "warning")]
    assert all(e.started_at == T0 for _, e in events)


def test_duplicates_in_one_cycle_become_one_alert_keeping_the_worst():
    lc = lifecycle()
    events = lc.update([finding(), finding(severity=Severity.CRITICAL), finding()], T0)
    assert [(e.finding.key, e.finding.severity) for e in events] == [("fs.usage:/data", Severity.CRITICAL)]


def test_resolves_after_keep_firing_for_and_says_how_long():
    lc = lifecycle()
    events = drive(lc, 30 * 60, 10, lambda t: [finding()] if t < 20 * 60 else [])
    assert kinds(events) == [(0, "firing", "warning"), (20 * 60 + 60, "resolved", "warning")]
    assert events[1][1].duration_s == 21 * 60
    assert lc.states == {}


def test_a_value_flapping_across_its_threshold_gives_no_storm():
    lc = lifecycle()
    flapping = lambda t: [finding()] if (t // 20) % 2 == 0 else []  # noqa: E731 - present 20 s, absent 20 s
    events = drive(lc, 2 * H, 10, flapping)
    assert kinds(events) == [(0, "firing", "warning")]
    events = drive(lc, 120, 10, lambda t: [])
    assert len(events) == 1 and events[0][1].status is AlertStatus.RESOLVED


def test_escalation_is_sent_at_once():
    lc = lifecycle()
    events = drive(lc, 600, 10, lambda t: [finding(severity=Severity.CRITICAL if t >= 300 else Severity.WARNING)])
    assert kinds(events) == [(0, "firing", "warning"), (300, "firing", "critical")]


def test_severity_flapping_gives_no_storm():
    # A value hovering at the critical level: critical, warning, critical... every other cycle for hours.
    lc = lifecycle()
    severity = lambda t: Severity.CRITICAL if (t // 10) % 2 else Severity.WARNING  # noqa: E731
    events = drive(lc, 3 * H, 10, lambda t: [finding(severity=severity(t))])
    assert kinds(events) == [(0, "firing", "warning"), (10, "firing", "critical")]


def test_a_lasting_de_escalation_is_sent_once():
    lc = lifecycle()
    events = drive(lc, 30 * 60, 10, lambda t: [finding(severity=Severity.CRITICAL if t < 600 else Severity.WARNING)])
    assert kinds(events) == [(0, "firing", "critical"), (660, "firing", "warning")]


def test_many_keys_are_independent():
    lc = lifecycle()
    keys = [f"fs.usage:/mnt/{i}" for i in range(20)]
    events = drive(lc, 300, 10, lambda t: [finding(k) for k in keys[: 10 + int(t // 30)]])
    assert Counter(e.finding.key for _, e in events) == Counter(keys)


def test_states_survive_a_restart(tmp_path):
    db = StateDb(str(tmp_path))
    lc = lifecycle(db.connect())
    drive(lc, 3 * H, 60, lambda t: [finding(), finding("fs.forecast:/data", for_s=600)])
    before = lc.states
    assert before["fs.usage:/data"].state == FIRING and before["fs.forecast:/data"].state == FIRING

    restarted = lifecycle(StateDb(str(tmp_path)).connect())
    assert restarted.states == before
    # Still firing after the restart: no duplicate message, and the repeats keep their schedule.
    both = lambda t: [finding(), finding("fs.forecast:/data", for_s=600)]  # noqa: E731
    events = [(t + 3 * H, e) for t, e in drive_from(restarted, 3 * H, 1.5 * H, 60, both)]
    assert kinds(events) == [(4 * H, "firing repeat", "warning"), (4 * H + 600, "firing repeat", "warning")]
    events = drive_from(restarted, 4.5 * H + 60, 120, 60, lambda t: [])
    assert [(t, e.status.value) for t, e in events] == [(60, "resolved"), (60, "resolved")]


def drive_from(lc, start, seconds, step, findings_at):
    events, t = [], 0.0
    while t <= seconds:
        events.extend((t, e) for e in lc.update(findings_at(t), T0 + start + t))
        t += step
    return events


def test_a_pending_alert_keeps_its_start_across_a_restart(tmp_path):
    lc = lifecycle(StateDb(str(tmp_path)).connect())
    drive(lc, 200, 10, lambda t: [finding(for_s=300)])
    restarted = lifecycle(StateDb(str(tmp_path)).connect())
    assert restarted.states["fs.usage:/data"].state == PENDING
    events = drive_from(restarted, 210, 200, 10, lambda t: [finding(for_s=300)])
    assert [t + 210 for t, _ in events] == [300]


def test_a_wall_clock_step_back_does_not_freeze_alerts():
    lc = lifecycle()
    lc.update([finding()], T0)
    lc.update([], T0 + 30)  # gone; resolves 60 s later
    jumped = T0 + 40 - H  # NTP stepped the clock back an hour
    assert lc.update([], jumped) == []
    # Without a monotonic reference the interval across the step counts as zero, never as -1 h.
    (e,) = lc.update([], jumped + 60)
    assert e.status is AlertStatus.RESOLVED
    # And a pending `for` is counted in elapsed time, not from a start now an hour "in the future".
    lc.update([finding("fs.inodes:/x", for_s=120)], jumped + 100)
    lc.update([finding("fs.inodes:/x", for_s=120)], jumped + 100 - H)
    (e,) = lc.update([finding("fs.inodes:/x", for_s=120)], jumped + 100 - H + 130)
    assert e.finding.key == "fs.inodes:/x"


def test_an_old_alerts_table_is_upgraded(tmp_path):
    path = os.path.join(tmp_path, "state.db")
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE alerts (key TEXT PRIMARY KEY, state TEXT NOT NULL, severity TEXT NOT NULL,
            pending_since REAL NOT NULL, firing_since REAL, last_sent REAL, missing_since REAL,
            finding TEXT NOT NULL);
        INSERT INTO alerts VALUES ('fs.usage:/data', 'firing', 'critical', 1.0, 1.0, 1.0, NULL,
            '{"key": "fs.usage:/data", "severity": "critical", "summary": "s", "details": {}, "labels": {},
              "value": null, "threshold": null, "for_s": 0, "hint": ""}');
    """)
    conn.close()
    lc = lifecycle(StateDb(str(tmp_path)).connect())
    assert lc.states["fs.usage:/data"].severity is Severity.CRITICAL
    assert lc.update([finding(severity=Severity.CRITICAL)], 2.0) == [], "no re-send after the upgrade"


# --------------------------------------------------------------------------- the daemon, end to end


def test_daemon_forecast_fires_once_survives_a_restart_and_resolves(tmp_path):
    clock, disk, recorder = FakeClock(), FakeDisk(), Recorder()
    rate = 10 * 2**30 / H  # 10 GiB/h onto a 100 GiB disk with 65 GiB free: 6.5 h, then sooner
    disk.avail = 65 * 2**30
    # This test is about the alert's life across a restart: let 30 min of evidence back a 6 h ETA (the
    # default evidence rule would wait until the rate has held as long as the ETA; tests/test_forecast.py).
    sections = {"forecast": {"window": "2h", "min_span": "20m", "evidence_ratio": 12}}
    d = daemon(tmp_path, clock, disk, recorder, sections)
    fired_at = None
    for i in range(6 * 60):  # 1 h at 10 s
        d.cycle()
        if fired_at is None and recorder.events:
            fired_at = i * 10
        clock.advance(10)
        disk.avail -= int(rate * 10)
    (e,) = recorder.events
    assert e.finding.key == "fs.forecast:/data" and e.finding.severity is Severity.WARNING
    # Warning once the ETA drops under 6 h: 65 GiB - 10 GiB/h * t = 60 GiB at t = 30 min.
    assert 25 * 60 <= fired_at <= 32 * 60

    d.close()
    recorder2 = Recorder()
    d2 = daemon(tmp_path, clock, disk, recorder2, sections)  # restarted: history and alert states come back
    for _ in range(30):
        d2.cycle()
        clock.advance(10)
        disk.avail -= int(rate * 10)
    assert recorder2.events == [], "no duplicate after a restart"
    disk.avail = 90 * 2**30  # someone cleaned up
    for _ in range(30):
        d2.cycle()
        clock.advance(10)
    assert [ev.status for ev in recorder2.events] == [AlertStatus.RESOLVED]
