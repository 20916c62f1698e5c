"""``fs.next_checkpoint:<mount>``: the next checkpoint will not fit.

A trainer saves a checkpoint of about the same size every N minutes: in the history of free space these
are steps, falls far faster than the background writes. From the last steps the detector learns their
size and period; with a checkpoints cleanup policy configured, the newest checkpoint under its roots
(sampled into ``Snapshot.checkpoints``) is a lower bound on the size. It warns when the free space
expected at the next write (now's, less the background writes until then) is less than the checkpoint
plus a margin, *before* that write, with its expected time; critical when the write is imminent.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.detectors import filesystem
from trainguard.detectors.steps import DROP_FRACTION, Points, Step, steps
from trainguard.records import CheckpointFact, Finding, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

STALE_PERIODS = 3.0  # a rhythm not seen for this many periods has stopped (the run ended)


@dataclass(frozen=True, slots=True)
class Rhythm:
    nbytes: float  # size of the next checkpoint
    every: float | None  # seconds between checkpoint writes; None: not known (size from a root only)
    last: float | None  # start of the newest write
    background: float  # bytes/s written between checkpoints


def rhythm(found: Sequence[Step], background: float, last_ts: float, facts: Sequence[CheckpointFact],
           min_steps: int, now: float) -> Rhythm | None:
    """What the next checkpoint on the mount will be, from its steps (those of the window, and the
    background rate between them, up to the sample at last_ts) and the policy roots' newest checkpoints."""
    newest = max((f.newest_bytes for f in facts), default=0)
    if len(found) >= min_steps:
        done = [s for s in found if s.end < last_ts] or found  # the write in progress may be partial
        every = statistics.median(b.start - a.start for a, b in zip(found, found[1:]))
        last = found[-1].start
        if now - last <= STALE_PERIODS * every:
            nbytes = max(statistics.median(s.nbytes for s in done[-5:]), done[-1].nbytes, newest)
            return Rhythm(nbytes, every, last, background)
    return Rhythm(float(newest), None, None, background) if newest else None


def _judge(r: Rhythm, avail: float, cfg, now: float) -> tuple[Severity, float | None, float, float] | None:
    """(severity, next write time, free then, needed) when the next checkpoint will not fit."""
    need = r.nbytes * (1 + cfg.checkpoint_margin)
    if r.every is None:
        return (Severity.WARNING, None, avail, need) if avail < need else None
    next_at = r.last + r.every
    while next_at < now - 0.5 * r.every:  # missed beats: the next one is due on the rhythm
        next_at += r.every
    next_at = max(next_at, now)
    free_then = avail - r.background * (next_at - now)
    if free_then >= need:
        return None
    severity = Severity.CRITICAL if next_at - now <= cfg.checkpoint_critical else Severity.WARNING
    return severity, next_at, free_then, need


def judge(trend, points: Points, avail: float, size: float, facts: Sequence[CheckpointFact], cfg,
          now: float, fit=None) -> tuple[Rhythm, tuple[Severity, float | None, float, float]] | None:
    """The rhythm and (severity, next write time, free then, needed) when the next checkpoint will not fit.
    `fit` (detectors.follow.Fit): the steps found by the mount's last full fit, instead of the points'."""
    if fit is not None:
        found, background, last_ts = list(fit.steps), fit.background, fit.last_ts
    elif points:
        (found, background), last_ts = steps(points, size), points[-1][0]
    else:
        found, background, last_ts = [], 0.0, now
    r = rhythm(found, background, last_ts, facts, cfg.checkpoint_min_steps, now)
    if r is None:
        return None
    if trend is not None and trend.cleanup_low is not None \
            and avail >= trend.cleanup_low - max(DROP_FRACTION * size, r.nbytes):
        # At a level where a cleanup that keeps up has come every cycle (a save, then its rotation; the
        # lows seen may be up to one checkpoint above the real ones): the next save will have room.
        return None
    verdict = _judge(r, avail, cfg, now)
    return None if verdict is None else (r, verdict)


HINT = ("free space before the next save (trainguard cleanup --dry-run shows candidates), lower keep_last, "
        "or save to a larger volume")


def detect(inp) -> list[Finding]:
    cfg = inp.config.forecast
    if not cfg.enabled or not cfg.next_checkpoint:
        return []
    findings: list[Finding] = []
    for sample in inp.snapshot.filesystems:
        mp, usage = sample.mount.mount_point, sample.usage
        if filesystem.ignored(inp.config.filesystems, mp) or not sample.responsive or usage is None:
            continue
        facts = [f for f in inp.snapshot.checkpoints if f.mount_point == mp]
        fit = inp.fit(sample)
        points = () if fit is not None else inp.history.points(f"fs.avail_bytes:{mp}", inp.now - cfg.window)
        found = judge(inp.trend(sample), points, usage.avail_bytes, usage.size_bytes, facts, cfg, inp.now, fit)
        if found is None:
            continue
        r, (severity, next_at, free_then, need) = found
        when = ("at the next save (its time is not known yet)" if next_at is None
                else f"at the next save, expected in ~{format_duration(next_at - inp.now)}")
        findings.append(Finding(
            key=f"fs.next_checkpoint:{mp}", severity=severity,
            summary=(f"{mp} {format_ratio(usage.used_ratio)} full: the next checkpoint "
                     f"(~{format_bytes(r.nbytes)}) will not fit {when}; {format_bytes(max(free_then, 0))} "
                     f"free then"),
            details={"mountpoint": mp, "checkpoint_bytes": round(r.nbytes), "needed_bytes": round(need),
                     "avail_bytes": usage.avail_bytes, "used_ratio": round(usage.used_ratio, 4), "avail_at_next_bytes": round(free_then),
                     "next_write_ts": round(next_at) if next_at is not None else None,
                     "next_write_in_seconds": round(next_at - inp.now) if next_at is not None else None,
                     "every_seconds": round(r.every) if r.every else None,
                     "roots": [f.root for f in facts]},
            labels=filesystem.labels_for(sample),
            value=free_then, threshold=need, hint=HINT,
        ))
    return findings
