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
    mount_id: int = 0  # mountinfo's first field (an fd's mnt_id); 0: not read from mountinfo


@dataclass(frozen=True, slots=True)
class FsUsage:
    """statvfs, computed like df: used / (used + avail) is the non-root view."""

    size_bytes: int
    used_bytes: int
    avail_bytes: int
    inodes_total: int
    inodes_used: int
    inodes_free: int  # f_ffree, as df -i counts free inodes
    # statvfs's f_fsid (from the UUID on ext4, btrfs, ...): with the device number, which filesystem this
    # is, so another disk mounted at the same path is told apart. 0 where the filesystem gives none.
    fsid: int = 0

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

    @property
    def permission_denied(self) -> bool:
        """statvfs refused for lack of permission (a non-root run): a fact about us, not about the mount."""
        return self.error is not None and self.error.endswith(("(errno 13)", "(errno 1)"))


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
class CheckpointFact:
    """The newest checkpoint under a checkpoints cleanup policy's root, as sampled this cycle (the
    next-checkpoint detector reads it here instead of the disk)."""

    root: str
    mount_point: str  # the mount holding the root
    newest_bytes: int
    newest_mtime: float
    newest_path: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything sampled in one cycle."""

    ts: float
    filesystems: tuple[FsSample, ...] = ()
    disks: tuple[DiskIo, ...] = ()
    missing_paths: tuple[str, ...] = ()  # configured paths that do not exist
    gpus: tuple["GpuSample", ...] = ()
    gpu_status: "NvmlStatus | None" = None  # None: GPU sampling not configured in this cycle
    log_matches: tuple["LogMatch", ...] = ()  # recent matches in watched training logs
    mirrors: tuple["MirrorState", ...] = ()  # the mirror worker's latest states (none configured: empty)
    checkpoints: tuple[CheckpointFact, ...] = ()  # newest checkpoint per checkpoints-policy root
    runs: tuple[RunSample, ...] = ()  # training runs on this host and their progress marks
    ended_runs: tuple[RunEnd, ...] = ()  # runs that ended recently, and how

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


# --- GPU and training-log records -------------------------------------------------


class NvmlState(str, Enum):
    """Why GPU data is (not) there. Only OK means samples are complete; the rest are states, not crashes."""

    OK = "ok"
    OFF = "off"  # disabled in the config
    NO_LIBRARY = "no_library"  # pynvml or libnvidia-ml.so.1 missing: a host without NVIDIA GPU
    NO_DRIVER = "no_driver"  # library present, kernel driver not loaded
    MISMATCH = "mismatch"  # NVML library and kernel driver versions differ (driver upgraded, no reboot)
    NO_PERMISSION = "no_permission"
    LOST = "lost"  # at least one GPU fell off the bus / is lost; the others are still sampled
    ERROR = "error"  # any other NVML failure


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    state: NvmlState
    message: str = ""  # one line a person can act on
    since: float | None = None  # wall time this state started
    next_retry: float | None = None  # wall time of the next attempt while not OK
    driver_version: str = ""
    device_count: int = 0
    lost: tuple[int, ...] = ()  # indices of lost GPUs


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU. NVML reports host PIDs; pid is the one valid in our /proc, if any."""

    host_pid: int
    pid: int | None  # None: not resolvable here (other PID namespace) -> never act on it
    used_memory_bytes: int | None  # None where the driver does not tell (e.g. some vGPU / MIG setups)
    state: str | None = None  # /proc state letter of pid ("R", "S", "D", "Z"); None when gone or unresolved
    exists: bool | None = None  # False: host PID namespace visible and the process is gone; None: unknown
    ns_pid: int | None = None  # the PID inside the process's own (container) namespace, from NSpid
    name: str = ""
    note: str = ""  # why a PID could not be resolved


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu_index: int
    xid: int
    ts: float


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU in one cycle. None fields were not supported by this GPU/driver or failed (see errors)."""

    index: int
    uuid: str
    name: str
    ts: float
    util_ratio: float | None = None  # mean GPU busy ratio since the previous sample (0..1)
    util_max_ratio: float | None = None  # highest driver sample in that window
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: int | None = None  # NVML clocks-event bitmask
    processes: tuple[GpuProcess, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()  # received since the previous sample
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC count (since the driver loaded)
    retired_pages: int | None = None  # pages retired for any cause (pre-Ampere page retirement)
    retired_pages_pending: bool | None = None
    lost: bool = False
    errors: Mapping[str, str] = field(default_factory=dict, compare=False)  # field -> NVML error text
    # GPU health, each None where this GPU/driver does not report it (as dcgm-exporter leaves it out).
    ecc_uncorrected_aggregate: int | None = None  # lifetime uncorrected ECC count (survives driver reloads)
    retired_pages_by_cause: Mapping[str, int] | None = field(default=None, compare=False)  # single_bit/double_bit
    remapped_rows_correctable: int | None = None  # Ampere+ row remapping
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None  # a remap waits for a GPU reset
    row_remap_failure: bool | None = None  # remapping failed: the GPU needs service
    xid_counts: Mapping[int, int] = field(default_factory=dict, compare=False)  # xid -> events since start
    minor_number: int | None = None  # N of /dev/nvidiaN (nvmlDeviceGetMinorNumber)

    @property
    def memory_used_ratio(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True, slots=True)
class LogMatch:
    """A line in a watched training log that matched one of its patterns."""

    path: str
    line: str
    pattern: str
    ts: float  # wall time the line was read


# --- training runs ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankSample:
    """One process of a training run as seen this cycle. `mark` changes whenever the process made
    visible progress (bytes written to storage, write positions of its open files, guard steps);
    CPU time is only a liveness hint: a rank waiting in a collective may spin."""

    pid: int
    rank: int | None  # RANK (else LOCAL_RANK) from its environment
    mark: int
    cpu_s: float
    blocked_threads: int = 0  # threads in D state or asleep in a filesystem wait
    main_blocked: bool = False  # its main thread is one of them: it queues no GPU work, whatever the GPU shows
    gpus: tuple[int, ...] = ()  # indices of the GPUs it has a context on
    outputs: tuple[str, ...] = ()  # its stdout/stderr files, or those its output pipe's reader writes
    grew_at: float | None = None  # when a watched log of the run last grew (credited to its lowest rank)


@dataclass(frozen=True, slots=True)
class RunSample:
    """One training job on this host: a launcher's ranks, or a Slurm job, pod or container."""

    run_id: str  # stable across daemon restarts: "<launcher pid>@<its start time>"
    name: str  # short and readable, for the alert key: "torchrun-4121", "slurm-123456"
    ranks: tuple[RankSample, ...]
    owner: Mapping[str, Any] = field(default_factory=dict, compare=False)  # sources.owner.Owner.to_dict()
    # The job across hosts: "slurm-<id>", torchrun's rendezvous id (TORCHELASTIC_RUN_ID), else the name.
    job: str = ""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A run whose processes are all gone; `error` is the line that says it failed, "" for none seen."""

    run_id: str
    name: str
    ts: float  # wall time it was first seen gone
    error: str = ""
    owner: Mapping[str, Any] = field(default_factory=dict, compare=False)
    how: str = "unknown"  # "finished", "error", "killed", "unknown" (no output could be read)


# --- mirror ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MirrorState:
    """Where one [[mirror]] stands: what is not on the share yet, and why."""

    name: str
    dest: str
    ts: float  # wall time this state was taken
    oldest_pending: float | None = None  # wall time of the oldest change not yet copied; None: all copied
    pending_files: int = 0
    pending_bytes: int = 0
    bytes_total: int = 0  # copied since the state db was created
    errors_total: int = 0
    last_ok: float | None = None  # wall time a round last ended with everything copied
    reason: str = ""  # why the last round did not copy everything; "" when it did
    reason_kind: str = ""  # "unresponsive", "full", "permission", "changing", "error" or ""
    # A copier killed for no progress that the kernel still holds (a request the share never answers):
    # its PID, the operation and path it sits in, and since when. None/"" when there is none.
    stuck_pid: int | None = None
    stuck_op: str = ""
    stuck_path: str = ""
    stuck_since: float | None = None

    def lag(self, now: float) -> float:
        """Seconds the oldest not-yet-copied change has waited (0 when everything is on the share)."""
        return max(0.0, now - self.oldest_pending) if self.oldest_pending is not None else 0.0
