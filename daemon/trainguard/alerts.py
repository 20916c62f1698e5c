"""Alert lifecycle, after Alertmanager: pending -> firing -> resolved.

A finding seen for the first time is pending; it fires once it has held for its
`for_s`. A firing alert is repeated every `repeat_interval`, re-sent when its
severity changes, and resolved only after its finding has been absent for
`keep_firing_for`, so a value flapping around a threshold yields one alert, not a
storm. States live in SQLite, so a restart neither re-sends nor forgets.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from trainguard.records import AlertEvent, AlertStatus, Finding, Severity

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,             -- pending | firing
    severity TEXT NOT NULL,
    pending_since REAL NOT NULL,
    firing_since REAL,
    last_sent REAL,
    missing_since REAL,
    finding TEXT NOT NULL            -- the last finding, JSON
);
"""

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
    def __init__(self, conn: sqlite3.Connection | None, *, repeat_interval: float, keep_firing_for: float):
        self.conn = conn
        self.repeat_interval = repeat_interval
        self.keep_firing_for = keep_firing_for
        self.states: dict[str, AlertState] = {}
        if conn is not None:
            conn.executescript(SCHEMA)
            self.states = {s.key: s for s in load_states(conn)}

    def configure(self, *, repeat_interval: float, keep_firing_for: float) -> None:
        self.repeat_interval = repeat_interval
        self.keep_firing_for = keep_firing_for

    @property
    def active(self) -> Mapping[str, Severity]:
        return {k: s.severity for k, s in self.states.items()}

    def firing(self) -> list[AlertState]:
        return [s for s in self.states.values() if s.state == FIRING]

    def update(self, findings: Iterable[Finding], now: float) -> list[AlertEvent]:
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
            if state.state == PENDING and now - state.pending_since >= f.for_s:
                state = replace(state, state=FIRING, firing_since=now, last_sent=now)
                events.append(AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now))
            elif state.state == FIRING and f.severity != old.severity:
                state = replace(state, last_sent=now)
                events.append(AlertEvent(AlertStatus.FIRING, f, started_at=state.firing_since, ts=now))
            elif state.state == FIRING and now - (state.last_sent or 0.0) >= self.repeat_interval:
                state = replace(state, last_sent=now)
                events.append(AlertEvent(AlertStatus.FIRING, f, started_at=state.firing_since, ts=now, repeat=True))
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
        self._save()
        return events

    def _save(self) -> None:
        if self.conn is None:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM alerts")
            self.conn.executemany(
                "INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.key, s.state, s.severity.value, s.pending_since, s.firing_since, s.last_sent, s.missing_since,
                  finding_to_json(s.finding)) for s in self.states.values()],
            )


def load_states(conn: sqlite3.Connection) -> list[AlertState]:
    try:
        rows = conn.execute(
            "SELECT key, state, severity, pending_since, firing_since, last_sent, missing_since, finding FROM alerts"
        ).fetchall()
    except sqlite3.OperationalError:  # no such table: a database from before alerts existed
        return []
    return [
        AlertState(key=r[0], state=r[1], severity=Severity(r[2]), pending_since=r[3], firing_since=r[4],
                   last_sent=r[5], missing_since=r[6], finding=finding_from_json(r[7]))
        for r in rows
    ]
