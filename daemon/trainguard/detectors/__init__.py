"""Detectors: pure functions from (config, history, snapshot, now) to findings.

No I/O happens here. `active` maps the keys of alerts that are pending or firing
to their severity, so a detector can apply hysteresis without holding state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping

from trainguard.config import Config
from trainguard.records import Finding, FsSample, Severity, Snapshot
from trainguard.store.history import History

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DetectorInput:
    config: Config
    history: History
    snapshot: Snapshot
    now: float
    active: Mapping[str, Severity] = field(default_factory=dict)
    # Fill trends fitted so far for this input (mount point -> Trend or None): the fit is the
    # costliest step of a cycle, and the detector, the metrics and `status` all need it.
    trends: dict = field(default_factory=dict, compare=False, repr=False)
    # The fits carried from the previous cycle (mount point -> detectors.follow.Fit), owned by the
    # daemon: a trend is refitted only when a new sample can change it. Updated here as mounts are fitted.
    fits: dict = field(default_factory=dict, compare=False, repr=False)
    # Each training run's learned cadence (run id -> store.progress.Cadence), after this cycle's marks.
    progress: Mapping = field(default_factory=dict, compare=False, repr=False)

    def trend(self, sample: FsSample):
        """The mount's fill trend (detectors.forecast.Trend or None), fitted once per input."""
        from trainguard.detectors.forecast import (
            mount_trend,  # forecast imports this package
        )

        mp = sample.mount.mount_point
        if mp not in self.trends:
            trend, fit = mount_trend(sample, self.history, self.config.forecast, self.now, self.fits.get(mp))
            self.trends[mp] = trend
            if fit is None:
                self.fits.pop(mp, None)
            else:
                self.fits[mp] = fit
        return self.trends[mp]

    def fit(self, sample: FsSample):
        """The mount's detectors.follow.Fit (its steps, its carried trend), or None."""
        self.trend(sample)
        return self.fits.get(sample.mount.mount_point)


Detector = Callable[[DetectorInput], list[Finding]]


def _registry() -> dict[str, Detector]:
    from trainguard.detectors import checkpoint, filesystem, forecast, gpu, io, mirror, progress

    return {
        "filesystem": filesystem.detect,
        "forecast": forecast.detect,
        "next_checkpoint": checkpoint.detect,
        "io": io.detect,
        "mirror": mirror.detect,
        **gpu.GPU_DETECTORS,
        **progress.PROGRESS_DETECTORS,
    }


DETECTORS: dict[str, Detector] = _registry()


def evaluate(inp: DetectorInput, detectors: Mapping[str, Detector] | None = None) -> list[Finding]:
    """Run every detector; one that raises is logged and skipped, the rest still run."""
    findings: list[Finding] = []
    for name, detector in (DETECTORS if detectors is None else detectors).items():
        try:
            findings.extend(detector(inp))
        except Exception:  # a detector bug must not stop the others or the daemon
            log.exception("detector %s failed", name)
    return findings
