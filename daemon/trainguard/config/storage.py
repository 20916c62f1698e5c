"""[filesystems], [forecast], [io] and [[logs]]: what is watched on the storage side."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trainguard.config.base import Strict
from trainguard.config.types import Duration, PositiveDuration, Ratio
from trainguard.units import format_duration


class Thresholds(Strict):
    warning: Ratio = 0.85
    critical: Ratio = 0.90
    inodes_warning: Ratio = 0.85
    inodes_critical: Ratio = 0.90

    @model_validator(mode="after")
    def _ordered(self) -> "Thresholds":
        if self.warning > self.critical:
            raise ValueError(f"warning ({self.warning:.0%}) is above critical ({self.critical:.0%})")
        if self.inodes_warning > self.inodes_critical:
            raise ValueError(
                f"inodes_warning ({self.inodes_warning:.0%}) is above inodes_critical ({self.inodes_critical:.0%})"
            )
        return self


class MountOverride(Strict):
    """Per-mount thresholds, matched by mount point or glob ("/root/autodl-*")."""

    match: str
    warning: Ratio | None = None
    critical: Ratio | None = None
    inodes_warning: Ratio | None = None
    inodes_critical: Ratio | None = None
    ignore: bool = False


class Filesystems(Thresholds):
    paths: list[str] = []  # always watched; each path is resolved to its mount
    exclude: list[str] = []  # mount point globs never watched
    include_fstypes: list[str] = []  # extra fstypes to watch besides the built-in list
    probe_timeout: PositiveDuration = 5.0
    hysteresis: Ratio = 0.03  # a usage alert clears this far below its threshold
    for_: Duration = Field(0.0, alias="for")
    overrides: list[MountOverride] = []

    @field_validator("overrides")
    @classmethod
    def _overrides_ordered(cls, overrides: list[MountOverride], info: ValidationInfo) -> list[MountOverride]:
        # Each override is merged over the global levels: refuse one that inverts them here, with its
        # match, instead of leaving a mount the detector cannot evaluate.
        levels = {k: info.data[k] for k in ("warning", "critical", "inodes_warning", "inodes_critical")
                  if k in info.data}
        if len(levels) < 4:
            return overrides  # a global level is itself invalid and already reported
        problems = []
        for i, override in enumerate(overrides):
            merged = {**levels, **{k: v for k in levels if (v := getattr(override, k)) is not None}}
            for low, high in (("warning", "critical"), ("inodes_warning", "inodes_critical")):
                if merged[low] > merged[high]:
                    problems.append(f"override {i} (match {override.match!r}): {low} ({merged[low]:.0%}) "
                                    f"is above {high} ({merged[high]:.0%})")
        if problems:
            raise ValueError("; ".join(problems))
        return overrides

    def thresholds_for(self, mount_point: str) -> Thresholds:
        names = ("warning", "critical", "inodes_warning", "inodes_critical")
        values = {k: getattr(self, k) for k in names}
        for override in self.overrides:
            if fnmatch.fnmatchcase(mount_point, override.match):
                values.update({k: v for k in names if (v := getattr(override, k)) is not None})
        # Already validated; two globs matching one mount may combine out of order, which must not raise.
        return Thresholds.model_construct(**values)

    def ignored(self, mount_point: str) -> bool:
        if any(fnmatch.fnmatchcase(mount_point, g) for g in self.exclude):
            return True
        return any(o.ignore and fnmatch.fnmatchcase(mount_point, o.match) for o in self.overrides)


class Forecast(Strict):
    enabled: bool = True
    window: PositiveDuration = 6 * 3600.0  # how much history the trend is fitted on
    min_span: Duration = 30 * 60.0  # no forecast before this much data
    warning: PositiveDuration = 6 * 3600.0  # warn at least this long before the filesystem is full
    critical: PositiveDuration = 3600.0
    # The ETA has its own error (a few per cent on checkpoint steps): alerting this much earlier than
    # `warning`/`critical` keeps the promise "at least 6 h ahead" instead of "about 6 h ahead".
    lead_margin: Ratio = 0.03
    # Minimum evidence before an alert: this many samples, and an ETA at most this many times as far
    # ahead as the rate has held (a burst of 1 h cannot raise a "full in 3 h" alarm at 1.0).
    min_samples: int = Field(30, ge=4)
    evidence_ratio: float = Field(1.0, gt=0)
    # "The next checkpoint will not fit" (fs.next_checkpoint): learned from the steps in free space.
    next_checkpoint: bool = True
    checkpoint_margin: Ratio = 0.10  # free space must exceed the next checkpoint by this fraction
    checkpoint_min_steps: int = Field(3, ge=2)  # steps seen before their size and period count
    checkpoint_critical: Duration = 1800.0  # critical when the next write is expected within this

    @model_validator(mode="after")
    def _ordered(self) -> "Forecast":
        if self.critical > self.warning:
            raise ValueError(f"critical ({format_duration(self.critical)}) is longer than warning "
                             f"({format_duration(self.warning)}); critical must be the shorter time to full")
        if self.min_span > self.window:
            raise ValueError(f"min_span ({format_duration(self.min_span)}) is longer than window "
                             f"({format_duration(self.window)}); no forecast could ever be made")
        return self


class Io(Strict):
    util_threshold: Ratio = 0.90
    for_: Duration = Field(300.0, alias="for")


DEFAULT_LOG_PATTERNS = (
    "No space left on device",
    "FileNotFoundError.*tfevents",
    "CUDA out of memory",
    "NCCL.*[Tt]imeout",
    "Traceback",
)


class LogWatch(Strict):
    """[[logs]]: training log files (globs) and the patterns that become findings."""

    paths: list[str]
    patterns: list[str] = list(DEFAULT_LOG_PATTERNS)
    observer: Literal["auto", "inotify", "polling"] = "auto"  # auto: polling on network/FUSE mounts
    hold: PositiveDuration = 1800.0  # a match stays an active finding this long
    severity: Literal["warning", "critical"] = "warning"

    @field_validator("paths")
    @classmethod
    def _has_paths(cls, paths: list[str]) -> list[str]:
        if not paths or not all(paths):
            raise ValueError("give at least one log file or glob, none of them empty")
        return paths

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        import re

        for pattern in patterns:
            if not pattern:
                raise ValueError("an empty pattern would match every line; remove it or write the text to look for")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
        return patterns
