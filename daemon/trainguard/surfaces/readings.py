"""What one cycle exposes on /metrics: built in the cycle, read by any number of scrapes.

Kept apart from the exporter so the daemon builds it without loading prometheus_client, which only
the metrics server imports, when it starts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.config import Progress
from trainguard.detectors.progress import timeout_of
from trainguard.records import Finding, RunSample, Snapshot
from trainguard.store.progress import Cadence


@dataclass(frozen=True, slots=True)
class RunProgress:
    """One training run as /metrics and `status` show it."""

    run: str
    job: str
    owner: Mapping[str, Any]
    timeout_s: float
    since: float  # the last progress, or (before any) when the run was first seen
    normal_gap_s: float
    ranks: tuple[tuple[int | None, int, float], ...]  # (rank, pid, its last progress or the run's `since`)
    verdict: str = "progressing"  # "progressing", "starting", "silent", "hung"


def run_progress(runs: Sequence[RunSample], cadences: Mapping[str, Cadence], cfg: Progress, now: float,
                 hung: Iterable[str] = ()) -> tuple[RunProgress, ...]:
    """The runs of this cycle with their learned timeouts (detectors.progress's rule)."""
    hung = set(hung)
    out = []
    for run in runs:
        c = cadences.get(run.run_id)
        if c is None:
            continue
        timeout, since = timeout_of(cfg, c)
        marks = {m.pid: m.last_progress for m in c.ranks}
        verdict = ("hung" if run.name in hung else "starting" if c.last_progress is None
                   else "silent" if now - since > timeout else "progressing")
        out.append(RunProgress(run.name, run.job or run.name, dict(run.owner), timeout, since, c.normal_gap(),
                               tuple((r.rank, r.pid, marks.get(r.pid) or since) for r in run.ranks), verdict))
    return tuple(out)


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
    runs: tuple[RunProgress, ...] = ()  # each training run's progress and timeout
