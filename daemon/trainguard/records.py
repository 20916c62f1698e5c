"""Plain immutable records passed between pipeline stages.

Samplers produce them, History stores their numbers, detectors turn them into
Findings, the alert lifecycle turns Findings into AlertEvents. No record holds a
live handle or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class MountKind(str, Enum):
    LOCAL = "local"
    NETWORK = "network"
    FUSE = "fuse"


@dataclass(frozen=True, slots=True)
class Mount:
    """One mounted filesystem, from /proc/self/mountinfo."""

    mount_point: str
    fstype: str
    source: str  # block device path, "server:/export", or the FUSE source name
    major: int
    minor: int
    kind: MountKind
    root: str = "/"  # path inside the filesystem that is mounted here (bind mounts)
    options: str = ""


@dataclass(frozen=True, slots=True)
class FsUsage:
    """statvfs, computed like df: used / (used + avail) is the non-root view."""

    size_bytes: int
    used_bytes: int
    avail_bytes: int
    inodes_total: int
    inodes_used: int
    inodes_free: int  # free for unprivileged users (f_favail)

    @property
    def used_ratio(self) -> float:
        denom = self.used_bytes + self.avail_bytes
        return self.used_bytes / denom if denom > 0 else 0.0

    @property
    def inodes_used_ratio(self) -> float | None:
        denom = self.inodes_used + self.inodes_free
        # btrfs, zfs and some FUSE filesystems report 0 inodes: not applicable.
        return self.inodes_used / denom if self.inodes_total > 0 and denom > 0 else None


@dataclass(frozen=True, slots=True)
class FsSample:
    """One probe result for one mount. usage is None when the probe did not answer."""

    mount: Mount
    ts: float
    usage: FsUsage | None
    responsive: bool = True
    unresponsive_since: float | None = None  # wall time the current stuck probe started
    error: str | None = None  # statvfs error (EACCES, ESTALE, ...) when it answered with one


@dataclass(frozen=True, slots=True)
class DiskIo:
    """Per block device rates over the last interval, from /proc/diskstats deltas."""

    name: str
    major: int
    minor: int
    util_ratio: float  # time busy / wall time, 0..1
    read_bytes_per_s: float
    write_bytes_per_s: float
    await_ms: float | None  # mean time per completed request; None with no requests


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything sampled in one cycle."""

    ts: float
    filesystems: tuple[FsSample, ...] = ()
    disks: tuple[DiskIo, ...] = ()
    missing_paths: tuple[str, ...] = ()  # configured paths that do not exist

    def disk_for(self, mount: Mount) -> DiskIo | None:
        for disk in self.disks:
            if (disk.major, disk.minor) == (mount.major, mount.minor):
                return disk
        return None


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """A condition a detector sees now. The lifecycle decides when it fires.

    key is stable across cycles ("fs.usage:/data"), so the same condition on the
    same object dedups to one alert. summary is one line a person reads on a
    phone; details are facts (name -> value) shown under it and sent as JSON.
    """

    key: str
    severity: Severity
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)  # mountpoint, device, gpu ...
    value: float | None = None
    threshold: float | None = None
    for_s: float = 0.0  # how long the condition must hold before the alert fires
    hint: str = ""  # the suggested next step

    @property
    def kind(self) -> str:
        """The detector part of the key: "fs.usage" for "fs.usage:/data"."""
        return self.key.split(":", 1)[0]


class AlertStatus(str, Enum):
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """A notification-worthy change: an alert started firing, repeats, escalated or resolved."""

    status: AlertStatus
    finding: Finding  # for resolved events: the last finding seen while firing
    started_at: float  # wall time the alert started firing
    ts: float  # wall time of this event
    repeat: bool = False  # a reminder for an alert still firing

    @property
    def duration_s(self) -> float:
        return self.ts - self.started_at
