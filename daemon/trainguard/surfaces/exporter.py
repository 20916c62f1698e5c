"""Prometheus /metrics over the latest cycle's readings.

The daemon builds one immutable `Readings` per cycle and swaps the reference; a
scrape only formats what is already there. No statfs, no NVML, no SQLite at
scrape time: a hung mount can never hang a scrape, and a scrape costs
microseconds per series.

Names are in base units (bytes, seconds, ratios 0..1). Labels identify objects
(mountpoint, fstype, device, gpu, uuid) and never carry PIDs or file paths, whose
churn would explode the series count of a fleet.
"""

from __future__ import annotations

import logging
import platform
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainguard import __version__
from trainguard.records import Finding, Severity
from trainguard.surfaces.gpu_metrics import gpu_families, gpu_stalls
from trainguard.surfaces.run_metrics import run_families
from trainguard.surfaces.readings import Readings

__all__ = ["Readings", "ReadingsCollector", "finding_counts", "gpu_stalls"]

log = logging.getLogger(__name__)

FS_LABELS = ("mountpoint", "fstype", "device")
FINDING_LABELS = ("kind", "severity", "mountpoint", "device", "gpu", "mirror")


def finding_counts(findings: tuple[Finding, ...]) -> dict[tuple[str, ...], int]:
    """(kind, severity, object labels...) -> findings, for trainguard_findings.

    Only the object labels in FINDING_LABELS are kept (never a PID or file label), so two
    orphan findings on one GPU count 2 in one series. A filesystem finding without a
    mountpoint label takes it from its key ("fs.next_checkpoint:/data").
    """
    counts: dict[tuple[str, ...], int] = {}
    for f in findings:
        labels = dict(f.labels)
        if f.kind.startswith("fs.") and "mountpoint" not in labels and ":" in f.key:
            labels["mountpoint"] = f.key.split(":", 1)[1]
        key = (f.kind, f.severity.value) + tuple(str(labels.get(n, "")) for n in FINDING_LABELS[2:])
        counts[key] = counts.get(key, 0) + 1
    return counts


class ReadingsCollector:
    """A custom collector: every scrape renders the Readings the source returns right now."""

    def __init__(self, source: Callable[[], Readings | None], *, host: str = ""):
        self.source = source
        self.host = host

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on what the host has (GPUs, cleanup ...)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("trainguard_build_info", "trainguard version and Python it runs on; always 1",
                                 labels=("version", "python"))
        info.add_metric((__version__, platform.python_version()), 1)
        yield info
        readings = self.source()
        if readings is None:
            return  # before the first cycle: no numbers rather than made-up zeros
        yield from self._cycle(readings)
        yield from self._filesystems(readings)
        yield from self._disks(readings)
        yield from self._gpus(readings)
        yield from self._alerts(readings)
        yield from self._counters(readings)
        yield from self._mirrors(readings)
        yield from run_families(readings.runs)

    def _cycle(self, r: Readings) -> Iterator[Metric]:
        yield GaugeMetricFamily("trainguard_last_cycle_timestamp_seconds",
                                "Unix time the last sampling cycle finished", value=r.ts)
        yield GaugeMetricFamily("trainguard_cycle_duration_seconds",
                                "How long the last sampling cycle took", value=r.cycle_duration_s)

    def _filesystems(self, r: Readings) -> Iterator[Metric]:
        gauges = {
            "size": GaugeMetricFamily("trainguard_filesystem_size_bytes", "Filesystem size", labels=FS_LABELS),
            "avail": GaugeMetricFamily("trainguard_filesystem_avail_bytes",
                                       "Bytes available to unprivileged users", labels=FS_LABELS),
            "used": GaugeMetricFamily("trainguard_filesystem_used_bytes",
                                      "Bytes used (size - free, like df)", labels=FS_LABELS),
            "files": GaugeMetricFamily("trainguard_filesystem_files", "Inodes in total", labels=FS_LABELS),
            "files_free": GaugeMetricFamily("trainguard_filesystem_files_free",
                                            "Inodes free for unprivileged users", labels=FS_LABELS),
            "eta": GaugeMetricFamily("trainguard_filesystem_fill_eta_seconds",
                                     "Forecast seconds until the filesystem is full; absent when not filling",
                                     labels=FS_LABELS),
            "responsive": GaugeMetricFamily("trainguard_filesystem_responsive",
                                            "1 when statfs answered within the probe timeout, 0 when it hangs",
                                            labels=FS_LABELS),
        }
        for s in r.snapshot.filesystems:
            m = s.mount
            labels = (m.mount_point, m.fstype, m.source)
            gauges["responsive"].add_metric(labels, 1.0 if s.responsive else 0.0)
            u = s.usage
            if u is None or not s.responsive or s.error:
                continue  # a stuck or failing mount has no current numbers: absent, not stale
            gauges["size"].add_metric(labels, u.size_bytes)
            gauges["avail"].add_metric(labels, u.avail_bytes)
            gauges["used"].add_metric(labels, u.used_bytes)
            if u.inodes_total > 0:
                gauges["files"].add_metric(labels, u.inodes_total)
                gauges["files_free"].add_metric(labels, u.inodes_free)
            eta = r.fill_eta.get(m.mount_point)
            if eta is not None:
                gauges["eta"].add_metric(labels, eta)
        yield from gauges.values()

    def _disks(self, r: Readings) -> Iterator[Metric]:
        # Only devices behind a watched filesystem, like the saturation detector: no series
        # for idle loop or zram devices.
        backing = {(s.mount.major, s.mount.minor) for s in r.snapshot.filesystems}
        disks = [d for d in r.snapshot.disks if (d.major, d.minor) in backing]
        if not disks:
            return
        util = GaugeMetricFamily("trainguard_disk_io_util_ratio",
                                 "Share of the last interval the device was busy (0..1)", labels=("device",))
        read = GaugeMetricFamily("trainguard_disk_read_bytes_per_second", "Read throughput over the last interval",
                                 labels=("device",))
        write = GaugeMetricFamily("trainguard_disk_write_bytes_per_second",
                                  "Write throughput over the last interval", labels=("device",))
        for d in disks:
            util.add_metric((d.name,), d.util_ratio)
            read.add_metric((d.name,), d.read_bytes_per_s)
            write.add_metric((d.name,), d.write_bytes_per_s)
        yield from (util, read, write)

    def _gpus(self, r: Readings) -> Iterator[Metric]:
        yield from gpu_families(r.snapshot.gpu_status, r.snapshot.gpus, r.findings)

    def _alerts(self, r: Readings) -> Iterator[Metric]:
        firing = GaugeMetricFamily("trainguard_alerts_firing", "Alerts the daemon has firing, by severity",
                                   labels=("severity",))
        for severity in Severity:
            firing.add_metric((severity.value,), r.firing.get(severity.value, 0))
        yield firing
        findings = GaugeMetricFamily(
            "trainguard_findings",
            "Conditions the daemon's detectors see this cycle (before the daemon's own `for`), by detector kind "
            "(fs.usage, fs.next_checkpoint, gpu.xid ...) and object; absent when none", labels=FINDING_LABELS)
        for labels, count in sorted(finding_counts(r.findings).items()):
            findings.add_metric(labels, count)
        if findings.samples:
            yield findings

    def _counters(self, r: Readings) -> Iterator[Metric]:
        if r.cleanup_freed is not None:
            freed = CounterMetricFamily("trainguard_cleanup_freed_bytes",
                                        "Bytes deleted by cleanup policies since the state db was created",
                                        labels=("policy",))
            for policy, nbytes in sorted(r.cleanup_freed.items()):
                freed.add_metric((policy,), nbytes)
            yield freed
        if r.notify_failures is not None:
            failures = CounterMetricFamily("trainguard_notify_failures",
                                           "Notification deliveries that failed (each attempt)",
                                           labels=("target",))
            for target, count in sorted(r.notify_failures.items()):
                failures.add_metric((target,), count)
            yield failures

    # --- mirror ([[mirror]]): one series per configured mirror, absent when none is configured

    def _mirrors(self, r: Readings) -> Iterator[Metric]:
        mirrors = r.snapshot.mirrors
        if not mirrors:
            return
        lag = GaugeMetricFamily("trainguard_mirror_lag_seconds",
                                "Age of the oldest local change not yet copied to the share; 0 when all is copied",
                                labels=("mirror",))
        copied = CounterMetricFamily("trainguard_mirror_bytes", "Bytes copied to the share since the state db "
                                     "was created", labels=("mirror",))
        errors = CounterMetricFamily("trainguard_mirror_errors", "Failed file copies and copiers killed for making "
                                     "no progress", labels=("mirror",))
        for m in mirrors:
            lag.add_metric((m.name,), m.lag(r.ts))
            copied.add_metric((m.name,), m.bytes_total)
            errors.add_metric((m.name,), m.errors_total)
        yield from (lag, copied, errors)
