"""Usage and inode thresholds, hung mounts, missing paths and I/O saturation, on synthetic inputs."""

from __future__ import annotations

import pytest
from trainguard import config as configmod
from trainguard.detectors import DetectorInput, evaluate, filesystem, io
from trainguard.records import FsSample, MountKind, Severity
from trainguard.store.history import History

from tests.support.snapshots import GiB, disk, fs_sample, mount, snapshot

NOW = 1_700_000_000.0


def cfg(**sections):
    return configmod.parse(sections, "test")


def run(detector, snap, config=None, active=None, history=None):
    return detector(DetectorInput(config or cfg(), history or History(None), snap, NOW, active or {}))


def by_key(findings):
    return {f.key: f for f in findings}


@pytest.mark.parametrize("used, severity", [
    (0.50, None), (0.849, None), (0.85, Severity.WARNING), (0.899, Severity.WARNING),
    (0.90, Severity.CRITICAL), (1.0, Severity.CRITICAL),
])
def test_usage_levels_at_the_default_thresholds(used, severity):
    found = by_key(run(filesystem.detect, snapshot(fs_sample("/data", used))))
    f = found.get("fs.usage:/data")
    assert (f.severity if f else None) is severity


def test_usage_finding_reads_well_and_carries_the_facts():
    (f,) = run(filesystem.detect, snapshot(fs_sample("/data", 0.961, size=100 * GiB)))
    assert f.summary == "/data 96.1% full, 3.9 GiB free"
    assert f.threshold == 0.90 and f.value == pytest.approx(0.961)
    assert f.labels["mountpoint"] == "/data" and f.labels["fstype"] == "xfs"
    assert f.details["avail_bytes"] == round(100 * GiB * 0.039)
    assert "cleanup" in f.hint


def test_per_mount_overrides_by_mount_point_and_glob():
    config = cfg(filesystems={"overrides": [
        {"match": "/scratch", "warning": "95%", "critical": "99%"},
        {"match": "/root/autodl-*", "warning": "70%", "critical": "80%"},
    ]})
    snap = snapshot(fs_sample("/scratch", 0.93), fs_sample("/root/autodl-tmp", 0.75, m=mount("/root/autodl-tmp")),
                    fs_sample("/data", 0.93))
    found = by_key(run(filesystem.detect, snap, config))
    assert "fs.usage:/scratch" not in found
    assert found["fs.usage:/root/autodl-tmp"].severity is Severity.WARNING
    assert found["fs.usage:/root/autodl-tmp"].threshold == 0.70
    assert found["fs.usage:/data"].severity is Severity.CRITICAL


def test_ignored_mounts_raise_nothing():
    config = cfg(filesystems={"overrides": [{"match": "/mnt/scratch*", "ignore": True}]})
    m = mount("/mnt/scratch1", "nfs4", (0, 50), MountKind.NETWORK)
    snap = snapshot(fs_sample(m=m, used_ratio=1.0), FsSample(mount("/mnt/scratch2", dev=(0, 51)), NOW, None,
                                                             responsive=False, unresponsive_since=NOW - 60))
    assert run(filesystem.detect, snap, config) == []


@pytest.mark.parametrize("active, used, expected", [
    # A warning clears 3 points below its threshold, not at it: a disk at 84-85 % does not flap.
    (Severity.WARNING, 0.83, Severity.WARNING),
    (Severity.WARNING, 0.821, Severity.WARNING),
    (Severity.WARNING, 0.819, None),
    (None, 0.84, None),
    # A critical steps down to warning only 3 points below critical.
    (Severity.CRITICAL, 0.88, Severity.CRITICAL),
    (Severity.CRITICAL, 0.869, Severity.WARNING),
    (Severity.CRITICAL, 0.80, None),
    (Severity.WARNING, 0.895, Severity.WARNING),
])
def test_hysteresis(active, used, expected):
    found = by_key(run(filesystem.detect, snapshot(fs_sample("/data", used)),
                       active={"fs.usage:/data": active} if active else {}))
    f = found.get("fs.usage:/data")
    assert (f.severity if f else None) is expected


def test_inode_thresholds_and_filesystems_without_inodes():
    snap = snapshot(fs_sample("/data", 0.2, inodes_used_ratio=0.95),
                    fs_sample("/tank", 0.2, m=mount("/tank", "zfs", (0, 41)), inodes_used_ratio=None))
    (f,) = run(filesystem.detect, snap)
    assert f.key == "fs.inodes:/data" and f.severity is Severity.CRITICAL
    assert "inodes 95.0% used" in f.summary


def test_for_duration_reaches_the_lifecycle():
    (f,) = run(filesystem.detect, snapshot(fs_sample("/data", 0.87)), cfg(filesystems={"for": "10m"}))
    assert f.for_s == 600


def test_unresponsive_mount_is_critical_at_once_and_says_for_how_long():
    m = mount("/root/autodl-fs", "fuse.juicefs", (0, 130), MountKind.FUSE)
    snap = snapshot(FsSample(m, NOW, None, responsive=False, unresponsive_since=NOW - 125))
    (f,) = run(filesystem.detect, snap)
    assert f.key == "fs.unresponsive:/root/autodl-fs" and f.severity is Severity.CRITICAL and f.for_s == 0
    assert "unresponsive" in f.summary and "2m" in f.summary and "fuse.juicefs" in f.summary
    assert f.details["stuck_seconds"] == 125 and "local disk" in f.hint


def test_unresponsive_mount_with_stale_usage_raises_no_usage_finding():
    m = mount("/mnt/nfs", "nfs4", (0, 33), MountKind.NETWORK)
    stale = fs_sample(m=m, used_ratio=0.99)
    snap = snapshot(FsSample(m, NOW, stale.usage, responsive=False, unresponsive_since=NOW - 10))
    assert [f.kind for f in run(filesystem.detect, snap)] == ["fs.unresponsive"]


def test_statfs_error_and_missing_path_are_warnings():
    m = mount("/mnt/nfs", "nfs4", (0, 33), MountKind.NETWORK)
    snap = snapshot(FsSample(m, NOW, None, error="Stale file handle (errno 116)"), missing=["/data/ckpt"])
    found = by_key(run(filesystem.detect, snap))
    assert found["fs.error:/mnt/nfs"].severity is Severity.WARNING
    assert "Stale file handle" in found["fs.error:/mnt/nfs"].summary
    assert found["fs.path_missing:/data/ckpt"].severity is Severity.WARNING
    assert found["fs.path_missing:/data/ckpt"].summary == "watched path /data/ckpt does not exist"


def test_first_probe_still_running_raises_nothing():
    assert run(filesystem.detect, snapshot(FsSample(mount(), NOW, None))) == []


def util_history(points):
    h = History(None)
    for ts, value in points:
        h.record(ts, {"disk.util:md0": value})
    return h


@pytest.mark.parametrize("util, minutes, fires", [
    (0.95, 6, True), (0.90, 5, True), (0.89, 6, False), (1.0, 3, False),
])
def test_io_saturation_needs_high_util_for_five_minutes(util, minutes, fires):
    h = util_history([(NOW - 10 * i, util) for i in reversed(range(minutes * 6 + 1))])
    found = run(io.detect, snapshot(fs_sample("/data", 0.5), disks=[disk("md0", (9, 0), util)]), history=h)
    assert bool(found) is fires
    if fires:
        (f,) = found
        assert f.key == "disk.saturated:md0" and f.severity is Severity.WARNING
        assert "/data" in f.summary and f.details["mountpoints"] == ["/data"]


def test_io_saturation_only_for_devices_behind_watched_filesystems():
    h = util_history([(NOW - 10 * i, 1.0) for i in reversed(range(40))])
    assert run(io.detect, snapshot(fs_sample("/data", 0.5, m=mount(dev=(8, 1))), disks=[disk("md0")]),
               history=h) == []


def test_a_broken_detector_does_not_stop_the_others(caplog):
    def broken(_inp):
        raise RuntimeError("bug")

    inp = DetectorInput(cfg(), History(None), snapshot(fs_sample("/data", 0.95)), NOW, {})
    found = evaluate(inp, {"broken": broken, "filesystem": filesystem.detect})
    assert [f.key for f in found] == ["fs.usage:/data"]
    assert "detector broken failed" in caplog.text
