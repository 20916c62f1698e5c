"""Alert lifecycle, after Alertmanager: pending -> firing -> resolved.

A finding seen for the first time is pending; it fires once it has held for its
`for_s`. A firing alert is repeated every `repeat_interval`, re-sent at once when
it escalates, and resolved only after its finding has been absent for
`keep_firing_for`, so a value flapping around a threshold yields one alert, not a
storm. A step down in severity is debounced the same way: it is sent once the
lower level has lasted `keep_firing_for`, so a value hovering at the critical
level does not alternate warning/critical messages. States live in SQLite, so a
restart neither re-sends nor forgets.

Durations are measured on the wall clock the states are stored in; when it steps
back (NTP, date -s) every stored time is moved back with it, so a pending `for`
or a resolve delay is not stretched by the size of the step.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.store.writes import WriteHealth

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,             -- pending | firing
    severity TEXT NOT NULL,
    pending_since REAL NOT NULL,
    firing_since REAL,
    last_sent REAL,
    missing_since REAL,
    finding TEXT NOT NULL,           -- the last finding, JSON
    notified TEXT,                   -- severity of the last message sent
    lower_since REAL                 -- when the severity fell below `notified`
);
"""
_ADDED_COLUMNS = {"notified": "TEXT", "lower_since": "REAL"}  # absent in databases of earlier versions
_COLUMNS = ("key", "state", "severity", "pending_since", "firing_since", "last_sent", "missing_since", "finding",
            "notified", "lower_since")
_TIMES = ("pending_since", "firing_since", "last_sent", "missing_since", "lower_since")

PENDING, FIRING = "pending", "firing"


@dataclass(frozen=True, slots=True)
class AlertState:
    key: str
    state: str
    severity: Severity
    pending_since: float
    finding: Finding
    firing_since: float | None = None
    last_sent: float | None = None
    missing_since: float | None = None
    notified: Severity | None = None
    lower_since: float | None = None


def finding_to_json(f: Finding) -> str:
    return json.dumps({
        "key": f.key, "severity": f.severity.value, "summary": f.summary, "details": dict(f.details),
        "labels": dict(f.labels), "value": f.value, "threshold": f.threshold, "for_s": f.for_s, "hint": f.hint,
    }, default=str)


def finding_from_json(text: str) -> Finding:
    d = json.loads(text)
    return Finding(key=d["key"], severity=Severity(d["severity"]), summary=d["summary"], details=d["details"],
                   labels=d["labels"], value=d["value"], threshold=d["threshold"], for_s=d["for_s"], hint=d["hint"])


class Lifecycle:
    def __init__(self, conn: sqlite3.Connection | None, *, repeat_interval: float, keep_firing_for: float,
                 writes: WriteHealth | None = None):
        self.conn = conn
        self.writes = writes  # None: a failed write raises
        self.repeat_interval = repeat_interval
        self.keep_firing_for = keep_firing_for
        self.states: dict[str, AlertState] = {}
        if conn is not None:
            conn.executescript(SCHEMA)
            have = {row[1] for row in conn.execute("PRAGMA table_info(alerts)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in have:
                    conn.execute(f"ALTER TABLE alerts ADD COLUMN {column} {kind}")
            self.states = {s.key: s for s in load_states(conn)}
        self._stored = self.states  # what the database holds: update() writes only when this differs
        self._last_now = max((t for st in self.states.values() for name in _TIMES
                              if (t := getattr(st, name)) is not None), default=None)

    def configure(self, *, repeat_interval: float, keep_firing_for: float) -> None:
        self.repeat_interval = repeat_interval
        self.keep_firing_for = keep_firing_for

    @property
    def active(self) -> Mapping[str, Severity]:
        return {k: s.severity for k, s in self.states.items()}

    def firing(self) -> list[AlertState]:
        return [s for s in self.states.values() if s.state == FIRING]

    def update(self, findings: Iterable[Finding], now: float) -> list[AlertEvent]:
        if self._last_now is not None and now < self._last_now:
            self._shift(now - self._last_now)
        self._last_now = now
        events: list[AlertEvent] = []
        seen: dict[str, Finding] = {}
        for f in findings:
            # Two findings with one key: keep the more severe, so dedup never hides a critical.
            if f.key not in seen or f.severity.rank > seen[f.key].severity.rank:
                seen[f.key] = f
        new_states: dict[str, AlertState] = {}
        for key, f in seen.items():
            old = self.states.get(key)
            if old is None:
                old = AlertState(key, PENDING, f.severity, now, f)
            state = replace(old, finding=f, severity=f.severity, missing_since=None)
            if state.state == PENDING:
                if now - state.pending_since >= f.for_s:
                    state = replace(state, state=FIRING, firing_since=now, last_sent=now, notified=f.severity,
                                    lower_since=None)
                    events.append(AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now))
                new_states[key] = state
                continue
            notified = state.notified or old.severity
            send, repeat = False, False
            if f.severity.rank > notified.rank:
                send = True  # escalation: at once
            elif f.severity.rank < notified.rank:
                lower_since = state.lower_since if state.lower_since is not None else now
                state = replace(state, lower_since=lower_since)
                send = now - lower_since >= self.keep_firing_for  # a step down, once it has lasted
            else:
                state = replace(state, lower_since=None)
            if not send and now - (state.last_sent or 0.0) >= self.repeat_interval:
                send, repeat = True, True
            if send:
                state = replace(state, last_sent=now, notified=f.severity, lower_since=None)
                events.append(AlertEvent(AlertStatus.FIRING, f, started_at=state.firing_since, ts=now,
                                         repeat=repeat))
            new_states[key] = state
        for key, old in self.states.items():
            if key in seen or old.state == PENDING:
                continue  # a pending alert whose condition went away is simply dropped
            missing_since = old.missing_since if old.missing_since is not None else now
            if now - missing_since >= self.keep_firing_for:
                events.append(AlertEvent(AlertStatus.RESOLVED, old.finding, started_at=old.firing_since, ts=now))
            else:
                new_states[key] = replace(old, missing_since=missing_since)
        self.states = new_states
        if new_states != self._stored:  # the usual cycle (nothing active, nothing changed) writes nothing
            # A state db that cannot be written (full disk) keeps the states in memory: the events still go
            # out, and the next cycle tries the write again.
            if self.writes is None:
                self._save()
                self._stored = new_states
            elif self.writes.attempt("alerts", self._save):
                self._stored = new_states
        return events

    def _shift(self, delta: float) -> None:
        """Move every stored time by delta (negative: the wall clock stepped back)."""
        self.states = {
            key: replace(st, **{name: t + delta for name in _TIMES if (t := getattr(st, name)) is not None})
            for key, st in self.states.items()
        }

    def _save(self) -> None:
        if self.conn is None:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM alerts")
            self.conn.executemany(
                f"INSERT INTO alerts ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                [(s.key, s.state, s.severity.value, s.pending_since, s.firing_since, s.last_sent, s.missing_since,
                  finding_to_json(s.finding), s.notified.value if s.notified else None, s.lower_since)
                 for s in self.states.values()],
            )


def load_states(conn: sqlite3.Connection) -> list[AlertState]:
    try:
        have = {row[1] for row in conn.execute("PRAGMA table_info(alerts)")}
        if not have:
            return []  # a database from before alerts existed
        columns = ", ".join(c if c in have else "NULL" for c in _COLUMNS)
        rows = conn.execute(f"SELECT {columns} FROM alerts").fetchall()
    except sqlite3.OperationalError:
        return []
    return [
        AlertState(key=r[0], state=r[1], severity=Severity(r[2]), pending_since=r[3], firing_since=r[4],
                   last_sent=r[5], missing_since=r[6], finding=finding_from_json(r[7]),
                   notified=Severity(r[8]) if r[8] else None, lower_since=r[9])
        for r in rows
    ]
