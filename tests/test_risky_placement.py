"""Prevention: a GPU process holding TensorBoard events, a checkpoint or a log open for writing on a
FUSE share gets an info finding before anything hangs; reading from the share or writing locally does not."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap

import pytest
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import Severity, Snapshot
from trainguard.sources.gpu import GpuSampler

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support.mounts import root_reason

WRITER = textwrap.dedent("""
    import sys, time
    share, local = sys.argv[1], sys.argv[2]
    held = [open(share + "/runs/exp1/events.out.tfevents.1700000000.box", "ab"),
            open(share + "/ckpt/step_100.pt", "wb"),
            open(share + "/data/train.bin", "rb"),          # reading a dataset from the share is fine
            open(local + "/train.log", "a")]                # writing locally is fine
    for fh in held[:2]:
        fh.write(b"x"); fh.flush()
    print("ready", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def share_writer(slowfs, tmp_path):
    for d in ("runs/exp1", "ckpt", "data"):
        (slowfs.mountpoint / d).mkdir(parents=True)
    (slowfs.mountpoint / "data" / "train.bin").write_bytes(b"data")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(slowfs.mountpoint), str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child, slowfs
    finally:
        child.kill()
        child.wait(timeout=10)


def _snapshot(*pids: int) -> Snapshot:
    clock = FakeClock()
    processes = [{"pid": pid, "used": GiB} for pid in pids]
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 95, "mem_used": 40 * GiB,
                                                     "processes": processes}])]}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock, host_pid_view=True, xid_events=False)
    try:
        return Snapshot(ts=clock.now, gpus=sampler.sample().gpus)
    finally:
        sampler.close()


def test_gpu_process_writing_events_and_checkpoints_on_a_share_gets_one_info_finding(share_writer):
    child, fs = share_writer
    (finding,) = StallDiagnoser(py_spy=False).risky_writes(_snapshot(child.pid))
    assert finding.key == f"gpu.risky_write:{child.pid}:{fs.mountpoint}"
    assert finding.severity is Severity.INFO
    assert "events.out.tfevents.1700000000.box" in finding.summary and str(fs.mountpoint) in finding.summary
    assert finding.details["files"] == [str(fs.mountpoint / "runs/exp1/events.out.tfevents.1700000000.box"),
                                        str(fs.mountpoint / "ckpt/step_100.pt")]
    assert finding.details["categories"] == ["checkpoint", "tfevents"]
    assert finding.details["fstype"] == fs.fstype and finding.details["attribution"] == "nvml"
    assert "[[mirror]]" in finding.hint and "28 %" in finding.hint
    # Whose process it is: here at least its user (the test's own), in the details, summary and alert.
    me = pwd.getpwuid(os.getuid()).pw_name
    assert finding.details["owners"][0]["user"] == me and f"user {me}" in finding.summary
    assert f"user {me}" in texts_for(finding, tr("en")).what and f"用户 {me}" in texts_for(finding, tr("zh")).what


def test_the_daemon_gets_the_finding_from_the_worker_without_waiting(share_writer):
    child, fs = share_writer
    snapshot = _snapshot(child.pid)
    diagnoser = StallDiagnoser(py_spy=False, clock=lambda: snapshot.ts)
    assert diagnoser.placement(snapshot) == []  # the first cycle only starts the scan
    assert diagnoser.worker.latest("placement").wait(10)
    (finding,) = diagnoser.placement(snapshot)
    assert finding.key == f"gpu.risky_write:{child.pid}:{fs.mountpoint}"


def test_nothing_when_no_gpu_process_writes_to_a_share(tmp_path):
    reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    try:
        assert StallDiagnoser(py_spy=False).risky_writes(_snapshot(reader.pid)) == []
    finally:
        reader.kill()
        reader.wait()


def test_a_mount_table_read_for_one_namespace_is_not_taken_for_another(share_writer):
    """The scan reads one mount table per mount namespace: a process first in line whose namespace does not
    have the share (here unmounted in its own) must not hide the share of the next one."""
    if reason := root_reason():
        pytest.skip(reason)
    child, fs = share_writer
    elsewhere = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                  f'umount -l "{fs.mountpoint}" && echo ready && exec cat'],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert elsewhere.stdout.readline().strip() == "ready"
        assert os.readlink(f"/proc/{elsewhere.pid}/ns/mnt") != os.readlink(f"/proc/{child.pid}/ns/mnt")
        findings = StallDiagnoser(py_spy=False).risky_writes(_snapshot(elsewhere.pid, child.pid))
        assert [f.key for f in findings] == [f"gpu.risky_write:{child.pid}:{fs.mountpoint}"]
    finally:
        elsewhere.kill()
        elsewhere.wait(timeout=10)
