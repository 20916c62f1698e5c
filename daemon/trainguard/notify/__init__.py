"""Notifiers receive alert events. The log notifier is always on.

A notifier must never block the sampling loop: slow deliveries belong in a
worker behind the notify() call.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

from trainguard.records import AlertEvent, AlertStatus
from trainguard.units import format_duration

log = logging.getLogger("trainguard.alerts.lifecycle")


class Notifier(Protocol):
    def notify(self, events: Sequence[AlertEvent]) -> None: ...

    def close(self) -> None: ...


def event_line(event: AlertEvent) -> str:
    """One readable line: FIRING [critical] /data 96.1% full, ~40m left (fs.forecast:/data)."""
    f = event.finding
    if event.status is AlertStatus.RESOLVED:
        return f"RESOLVED [{f.severity.value}] {f.summary} (after {format_duration(event.duration_s)}; {f.key})"
    tag = "REPEAT" if event.repeat else "FIRING"
    return f"{tag} [{f.severity.value}] {f.summary} ({f.key})"


class LogNotifier:
    def notify(self, events: Sequence[AlertEvent]) -> None:
        for event in events:
            level = logging.WARNING if event.status is AlertStatus.FIRING else logging.INFO
            if event.finding.severity.value == "critical" and event.status is AlertStatus.FIRING:
                level = logging.ERROR
            log.log(level, event_line(event))

    def close(self) -> None:
        pass
