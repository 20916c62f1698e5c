"""What one cycle exposes on /metrics: built in the cycle, read by any number of scrapes.

Kept apart from the exporter so the daemon builds it without loading prometheus_client, which only
the metrics server imports, when it starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from trainguard.records import Finding, Snapshot


@dataclass(frozen=True, slots=True)
class Readings:
    """What one cycle exposes. Built in the cycle, read by any number of scrapes."""

    snapshot: Snapshot
    ts: float  # wall time the cycle finished
    cycle_duration_s: float
    fill_eta: Mapping[str, float] = field(default_factory=dict)  # mountpoint -> seconds to full (filling only)
    firing: Mapping[str, int] = field(default_factory=dict)  # severity -> alerts firing
    findings: tuple[Finding, ...] = ()
    cleanup_freed: Mapping[str, int] | None = None  # policy -> bytes freed since install; None: no cleanup
    notify_failures: Mapping[str, int] | None = None  # target -> failed deliveries; None: no outbox
