"""/metrics: what a fleet's Prometheus sees, rendered from the latest cycle only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from trainguard.records import (
    DiskIo,
    Finding,
    FsSample,
    FsUsage,
    GpuProcess,
    GpuSample,
    Mount,
    MountKind,
    NvmlState,
    NvmlStatus,
    Severity,
    Snapshot,
)
from trainguard.surfaces.exporter import Readings, ReadingsCollector

from tests.support.daemon_proc import DaemonProcess, child_env, wait_until
from tests.support.mounts import fill


def mount(mp: str, fstype: str = "ext4", source: str = "/dev/sda1") -> Mount:
    return Mount(mount_point=mp, fstype=fstype, source=source, major=8, minor=1, kind=MountKind.LOCAL)


USAGE = FsUsage(size_bytes=1000, used_bytes=600, avail_bytes=350, inodes_total=100, inodes_used=40, inodes_free=60)


def scrape(readings: Readings | None) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadingsCollector(lambda: readings))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families, name, **labels):
    for sample in families[name]:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise KeyError(f"{name}{labels} not in {families.get(name)}")


def test_before_the_first_cycle_only_build_info_is_exposed():
    families = scrape(None)
    assert set(families) == {"trainguard_build_info"}


def test_filesystems_in_base_units_and_a_hung_mount_has_no_stale_numbers():
    snap = Snapshot(ts=1.0, filesystems=(
        FsSample(mount("/data"), 1.0, USAGE),
        FsSample(mount("/mnt/nfs", "nfs4", "srv:/export"), 1.0, USAGE, responsive=False, unresponsive_since=0.5),
    ), disks=(DiskIo("sda1", 8, 1, 0.25, 10.0, 20.0, 1.5), DiskIo("loop0", 7, 0, 0.0, 0.0, 0.0, None)))
    families = scrape(Readings(snap, ts=2.0, cycle_duration_s=0.01, fill_eta={"/data": 7200.0}))
    labels = {"mountpoint": "/data", "fstype": "ext4", "device": "/dev/sda1"}
    assert value(families, "trainguard_filesystem_avail_bytes", **labels) == 350
    assert value(families, "trainguard_filesystem_size_bytes", **labels) == 1000
    assert value(families, "trainguard_filesystem_files_free", **labels) == 60
    assert value(families, "trainguard_filesystem_fill_eta_seconds", **labels) == 7200
    assert value(families, "trainguard_filesystem_responsive", mountpoint="/data") == 1
    assert value(families, "trainguard_filesystem_responsive", mountpoint="/mnt/nfs", device="srv:/export") == 0
    assert not [s for s in families["trainguard_filesystem_avail_bytes"] if s.labels["mountpoint"] == "/mnt/nfs"]
    assert value(families, "trainguard_disk_io_util_ratio", device="sda1") == 0.25
    assert {s.labels["device"] for s in families["trainguard_disk_io_util_ratio"]} == {"sda1"}  # not idle loops
    # Families whose feature has no data are absent, not zero.
    assert "trainguard_gpu_utilization_ratio" not in families
    assert "trainguard_cleanup_freed_bytes" not in families


def test_gpu_stall_comes_from_the_detector_and_labels_carry_no_pids():
    proc = GpuProcess(host_pid=4242, pid=4242, used_memory_bytes=70 * 2**30)
    gpus = (GpuSample(0, "GPU-aaa", "H100", 1.0, util_ratio=0.0, memory_used_bytes=70 * 2**30,
                      memory_total_bytes=80 * 2**30, processes=(proc,)),
            GpuSample(1, "GPU-bbb", "H100", 1.0, util_ratio=0.9, memory_used_bytes=10 * 2**30,
                      memory_total_bytes=80 * 2**30))
    stall = Finding(key="gpu.stall:0", severity=Severity.CRITICAL, summary="GPU 0 stalled",
                    details={"stalled_for_s": 900.0, "processes": [{"host_pid": 4242}]},
                    labels={"gpu": "0", "uuid": "GPU-aaa"})
    r = Readings(Snapshot(ts=1.0, gpus=gpus, gpu_status=NvmlStatus(NvmlState.OK)), ts=1.0, cycle_duration_s=0.0, findings=(stall,),
                 firing={"critical": 1}, cleanup_freed={"old-checkpoints": 5 * 2**30}, notify_failures={"oncall": 3})
    families = scrape(r)
    assert value(families, "trainguard_gpu_stalled", gpu="0", uuid="GPU-aaa") == 1
    assert value(families, "trainguard_gpu_stall_seconds", gpu="0") == 900
    assert value(families, "trainguard_gpu_stalled", gpu="1") == 0
    assert value(families, "trainguard_gpu_utilization_ratio", gpu="1") == 0.9
    assert value(families, "trainguard_gpu_memory_used_bytes", gpu="0") == 70 * 2**30
    assert value(families, "trainguard_gpu_compute_processes", gpu="0") == 1
    assert value(families, "trainguard_nvml_state", state="ok") == 1
    assert value(families, "trainguard_alerts_firing", severity="critical") == 1
    assert value(families, "trainguard_alerts_firing", severity="warning") == 0
    assert value(families, "trainguard_cleanup_freed_bytes", policy="old-checkpoints") == 5 * 2**30
    assert value(families, "trainguard_notify_failures", target="oncall") == 3
    for samples in families.values():
        for s in samples:
            assert not {"pid", "path", "file"} & set(s.labels), s


def test_stall_owners_are_labels_of_the_stall_series_only_and_bounded():
    gpus = (GpuSample(0, "GPU-aaa", "H100", 1.0, util_ratio=0.0, memory_used_bytes=70 * 2**30,
                      memory_total_bytes=80 * 2**30),
            GpuSample(1, "GPU-bbb", "H100", 1.0, util_ratio=0.9, memory_used_bytes=10 * 2**30,
                      memory_total_bytes=80 * 2**30))
    pod = {"runtime": "containerd", "container_id": "c0ffee00" * 8, "pod_uid": "3c5e9f7a-5b1d-4c2e-9f3a-1b2c3d4e5f60",
           "namespace": "ml", "pod": "train-7f", "user": "alice", "uid": 1000}
    job = {"slurm_job": "4242", "slurm_step": "0", "slurm_account": "nlp", "user": "bob", "uid": 1001}
    # Ranks of one job differ only in what is not a label: they share one series.
    owners = [pod, {**pod, "uid": 0}, job] + [{"user": f"u{i}"} for i in range(20)]
    stall = Finding(key="gpu.stall:0", severity=Severity.CRITICAL, summary="GPU 0 stalled",
                    details={"stalled_for_s": 900.0, "owners": owners[:8]}, labels={"gpu": "0"})
    families = scrape(Readings(Snapshot(ts=1.0, gpus=gpus), ts=1.0, cycle_duration_s=0.0, findings=(stall,)))
    series = families["trainguard_gpu_stall_process_seconds"]
    assert value(families, "trainguard_gpu_stall_process_seconds", gpu="0", namespace="ml", pod="train-7f",
                 container="c0ffee00c0ff", slurm_job="", user="alice") == 900
    assert value(families, "trainguard_gpu_stall_process_seconds", slurm_job="4242", user="bob", pod="") == 900
    assert len(series) == 7 and {s.labels["gpu"] for s in series} == {"0"}  # 8 owners, two alike; GPU 1 none
    assert set(series[0].labels) == {"gpu", "uuid", "namespace", "pod", "container", "slurm_job", "user"}
    for name, samples in families.items():  # on no other family
        if name != "trainguard_gpu_stall_process_seconds":
            assert not any("user" in s.labels or "slurm_job" in s.labels for s in samples), name
    calm = scrape(Readings(Snapshot(ts=1.0, gpus=gpus), ts=1.0, cycle_duration_s=0.0))
    assert "trainguard_gpu_stall_process_seconds" not in calm


# ---------------------------------------------------------------- a running daemon


def config(state_dir, paths, *, probe_timeout="1s", interval="0.3s") -> str:
    return f"""
[general]
state_dir = "{state_dir}"
interval = "{interval}"
[filesystems]
paths = {json.dumps([str(p) for p in paths])}
exclude = ["*"]   # only the mounts of the paths above: other mounts on a shared host are not ours to probe
probe_timeout = "{probe_timeout}"
[metrics]
listen = "127.0.0.1:0"
"""


def http_scrape(url: str, timeout: float = 5.0) -> tuple[dict[str, list], float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    elapsed = time.monotonic() - started
    return {f.name: f.samples for f in text_string_to_metric_families(text)}, elapsed


@pytest.mark.root
def test_scrape_of_a_running_daemon_matches_status_json(tmp_path, tmpfs_mount):
    fill(tmpfs_mount / "ckpt.bin", 5 * 2**20)
    cfg_text = config(tmp_path / "state", [tmpfs_mount])
    with DaemonProcess(tmp_path, cfg_text) as daemon:
        url = daemon.metrics_url()
        mp = str(tmpfs_mount)

        def scraped():
            families, _ = http_scrape(url)
            return families if "trainguard_filesystem_avail_bytes" in families else None
        families = wait_until(scraped, 10, what="first cycle on /metrics")
        status = subprocess.run([sys.executable, "-m", "trainguard", "status", "--json", "-c",
                                 str(daemon.config_path)], capture_output=True, text=True, env=child_env(),
                                timeout=30, check=True)
    doc = json.loads(status.stdout)
    fs = next(f for f in doc["filesystems"] if f["mountpoint"] == mp)
    labels = {"mountpoint": mp, "fstype": "tmpfs"}
    assert value(families, "trainguard_filesystem_size_bytes", **labels) == fs["size_bytes"] == 16 * 2**20
    assert value(families, "trainguard_filesystem_avail_bytes", **labels) == fs["avail_bytes"]
    assert value(families, "trainguard_filesystem_used_bytes", **labels) == fs["used_bytes"] >= 5 * 2**20
    assert value(families, "trainguard_filesystem_files_free", **labels) == fs["inodes_free"]
    assert value(families, "trainguard_filesystem_responsive", **labels) == (1 if fs["responsive"] else 0) == 1


@pytest.mark.fuse
@pytest.mark.parametrize("slowfs", [{"name": "autodl-fs"}], indirect=True)
def test_scrape_while_a_mount_hangs_returns_promptly_with_responsive_0(tmp_path, slowfs):
    slowfs.block("statfs")
    cfg_text = config(tmp_path / "state", [slowfs.mountpoint], probe_timeout="0.5s")
    with DaemonProcess(tmp_path, cfg_text) as daemon:
        try:
            url = daemon.metrics_url()
            mp = str(slowfs.mountpoint)

            def hung_reported():
                families, _ = http_scrape(url)
                samples = [s for s in families.get("trainguard_filesystem_responsive", [])
                           if s.labels["mountpoint"] == mp]
                return families if samples and samples[0].value == 0 else None
            wait_until(hung_reported, 10, what="responsive 0 for the hung mount")
            slowfs.wait_blocked("statfs")
            # The probe is still stuck in the kernel: every scrape answers from memory, fast.
            elapsed = max(http_scrape(url)[1] for _ in range(5))
            assert elapsed < 0.5
            families, _ = http_scrape(url)
            assert value(families, "trainguard_filesystem_responsive", mountpoint=mp, fstype="fuse.autodl-fs") == 0
            assert not [s for s in families.get("trainguard_filesystem_avail_bytes", []) if s.labels["mountpoint"] == mp]
            assert value(families, "trainguard_alerts_firing", severity="critical") >= 1
        finally:
            # A thread waiting on a FUSE answer cannot be killed until the answer comes:
            # release it before the daemon is stopped.
            slowfs.unblock("statfs")


def test_cleanup_freed_counter_follows_the_audit_totals(tmp_path):
    from trainguard import config as configmod
    from trainguard.actions.cleanup.record.audit import AuditLog
    from trainguard.service.daemon import Daemon
    from trainguard.store.state import StateDb

    state_dir = tmp_path / "state"
    watched = tmp_path / "data"
    watched.mkdir()
    cfg = configmod.parse({"general": {"state_dir": str(state_dir)}, "gpu": {"enabled": False},
                           "filesystems": {"paths": [str(watched)], "exclude": ["*"]}}, "test")
    daemon = Daemon(configmod.Loaded(cfg, "test"))
    try:
        daemon.cycle()
        assert daemon.readings.cleanup_freed is None  # no cleanup ever: no counter family
        assert "trainguard_cleanup_freed_bytes" not in scrape(daemon.readings)
        audit = AuditLog(StateDb(str(state_dir), check=None).connect())
        audit.record("old-checkpoints", "/data", "/data/ckpt-1.pt", 3 * 2**30, 1, "older than the newest 3")
        audit.flush()
        audit.conn.close()
        daemon.cycle()
        families = scrape(daemon.readings)
        assert value(families, "trainguard_cleanup_freed_bytes", policy="old-checkpoints") == 3 * 2**30
    finally:
        daemon.close()


def test_notify_failures_counter_counts_failed_delivery_attempts(tmp_path):
    import socket

    from trainguard import config as configmod
    from trainguard.service.daemon import Daemon

    with socket.socket() as s:  # a loopback port with nothing listening: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = tmp_path / "not-there"  # a watched path that does not exist fires a warning at once
    cfg = configmod.parse({
        "general": {"state_dir": str(tmp_path / "state")}, "gpu": {"enabled": False},
        "filesystems": {"paths": [str(missing)], "exclude": ["*"]},
        "notify": {"targets": [{"name": "down", "url": f"json://127.0.0.1:{port}/hook"}],
                   "retry_initial": "100ms", "retry_max": "200ms", "group_interval": "0s"},
    }, "test")
    daemon = Daemon(configmod.Loaded(cfg, "test"))
    try:
        daemon.cycle()
        assert daemon.readings.notify_failures == {"down": 0}
        deadline = time.monotonic() + 30
        while daemon.readings.notify_failures["down"] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            daemon.cycle()
        failures = daemon.readings.notify_failures["down"]
        assert failures >= 2, "the refused webhook was not retried and counted"
        assert value(scrape(daemon.readings), "trainguard_notify_failures", target="down") == failures
    finally:
        daemon.close()
