"""Time-to-full forecast finding (``fs.forecast:<mount>``) from the mount's fill trend (detectors.trend).

An alert needs evidence as well as a short ETA: the trend must rest on at least ``min_samples`` samples
and ``min_span`` of history, and the ETA may reach at most ``evidence_ratio`` times as far ahead as the
rate has held (``Trend.evidence``). In the first hours of history, during a download that will stop, or
on the rising edge of a saw-tooth just after a change, the forecast is shown but not alerted on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.detectors import filesystem
from trainguard.detectors.follow import Fit, follow_trend, learned, seeded  # noqa: F401  (follow_trend re-exported)
from trainguard.detectors.postpone import MAX_ERROR, early_counts
from trainguard.detectors.trend import Trend, fill_trend  # noqa: F401  (fill_trend re-exported)
from trainguard.records import Finding, FsSample, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

if TYPE_CHECKING:
    from trainguard.config import Forecast
    from trainguard.store.history import History


def mount_trend(sample: FsSample, history: History, cfg: Forecast, now: float,
                prev: Fit | None = None) -> tuple[Trend | None, Fit | None]:
    """A sampled mount's fill trend from its history, and the Fit to pass back next cycle: the one fit
    the detector, the metrics and `status` all show, refitted only when a new sample can change it
    (detectors.follow). No trend for a mount without usable usage, but the cleanup cycles learned so
    far are kept: one unreadable sample must not forget a daily cleanup."""
    if not sample.responsive or sample.usage is None or sample.usage.size_bytes <= 0:
        return None, (seeded(learned(prev)) if prev is not None and (prev.cycles or prev.writes) else None)
    name = f"fs.avail_bytes:{sample.mount.mount_point}"
    return follow_trend(prev, lambda since: history.points(name, since), sample.usage.size_bytes, now, cfg)


def level(trend: Trend | None, cfg: Forecast, active: Severity | None = None) -> tuple[Severity, float] | None:
    """(severity, threshold) the trend alerts at, or None. Hysteresis in time: an active alert clears
    only when the ETA moves 20 % past its limit."""
    if trend is None or trend.eta is None or trend.points < cfg.min_samples or trend.quiet:
        return None
    slack = 1.2 if active is not None else 1.0
    # The ETA's own error: alert a little early rather than a little late; where the fit knows its
    # error (the scatter of checkpoint sizes and intervals, of a saw-tooth's lows), by twice that, up to
    # a fifth as early again. The evidence is stretched alike: a 6 h window could never back a 6.4 h ETA.
    early = 1.0 + max(cfg.lead_margin, 2 * min(trend.eta_error, MAX_ERROR))
    eta = trend.eta
    if early_counts(trend) and trend.eta_early * early < eta * (1.0 + cfg.lead_margin):
        # A saw-tooth whose low before some cleanup may already reach zero (its lows a few of their
        # errors lower), a staircase whose write may not fit one period early (the writes to come a few
        # of their errors larger): that time, with the lead margin, is what the lead is kept against.
        eta, early = trend.eta_early, 1.0 + cfg.lead_margin
    if eta > cfg.evidence_ratio * trend.evidence * slack * early:
        return None  # a forecast further ahead than the rate has held: not enough evidence yet
    if eta < cfg.critical * early * (slack if active is Severity.CRITICAL else 1.0):
        return Severity.CRITICAL, cfg.critical
    if eta < cfg.warning * early * slack:
        return Severity.WARNING, cfg.warning
    return None


def _cleanup_words(trend: Trend) -> str:
    """The saw-tooth part of the summary: when the next cleanup is due, and what if it does not come."""
    if not trend.cleanup_every:
        return ""
    every, frees = format_duration(trend.cleanup_every), format_bytes(trend.cleanup_frees)
    if trend.cleanup_missed:
        return f"; the cleanup that freed {frees} every {every} did not come: counting on none"
    return (f", counting the cleanup that frees {frees} every {every} (next expected in "
            f"~{format_duration(trend.next_cleanup_in or 0)}; without it full in "
            f"~{format_duration(trend.eta_without_cleanup or 0)})")


def _cleanup_details(trend: Trend) -> dict:
    if not trend.cleanup_every:
        return {}
    return {"cleanup_every_seconds": round(trend.cleanup_every), "cleanup_frees_bytes": round(trend.cleanup_frees),
            "cleanup_missed": trend.cleanup_missed,
            "next_cleanup_in_seconds": round(trend.next_cleanup_in or 0),
            "eta_without_cleanup_seconds": round(trend.eta_without_cleanup or 0)}


HINT = "free space now (trainguard cleanup --dry-run shows candidates) or move output to a larger volume"


def detect(inp) -> list[Finding]:
    cfg = inp.config.forecast
    if not cfg.enabled:
        return []
    findings: list[Finding] = []
    for sample in inp.snapshot.filesystems:
        mp = sample.mount.mount_point
        if filesystem.ignored(inp.config.filesystems, mp):
            continue
        trend = inp.trend(sample)
        key = f"fs.forecast:{mp}"
        alert = level(trend, cfg, inp.active.get(key))
        if alert is None:
            continue
        severity, threshold = alert
        usage = sample.usage
        rate_per_hour = trend.slope * 3600
        findings.append(Finding(
            key=key, severity=severity,
            summary=(f"{mp} {format_ratio(usage.used_ratio)} full, ~{format_duration(trend.eta)} left "
                     f"at {format_bytes(rate_per_hour)}/h" + _cleanup_words(trend)),
            details={"mountpoint": mp, "eta_seconds": round(trend.eta), "fill_bytes_per_second": round(trend.slope, 1),
                     "avail_bytes": usage.avail_bytes, "used_ratio": round(usage.used_ratio, 4),
                     "fitted_span_seconds": round(trend.span), "evidence_seconds": round(trend.evidence),
                     **_cleanup_details(trend)},
            labels=filesystem.labels_for(sample),
            value=trend.eta, threshold=threshold, hint=HINT,
        ))
    return findings
