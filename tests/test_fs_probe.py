"""statvfs probes: usage computed like df, and a mount whose statfs blocks never blocks the daemon.

The probes run in real threads, so these tests use the real clock with short timeouts and wait on
events; the mount table and statvfs are injected.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time
from collections import Counter

import pytest
from trainguard.clock import SystemClock
from trainguard.records import Mount, MountKind
from trainguard.sources.fs import FsSampler, child_probe, usage_from_statvfs


def statvfs_result(blocks=1000, bfree=400, bavail=300, files=100, ffree=40, favail=30, frsize=4096):
    return os.statvfs_result((frsize, frsize, blocks, bfree, bavail, files, ffree, favail, 0, 255))


def test_usage_is_computed_like_df():
    u = usage_from_statvfs(statvfs_result())
    assert (u.size_bytes, u.used_bytes, u.avail_bytes) == (1000 * 4096, 600 * 4096, 300 * 4096)
    # Reserved blocks (bfree - bavail) count neither as used nor as available, as in df's Use%.
    assert u.used_ratio == pytest.approx(600 / 900)
    # Free inodes as df -i counts them (f_ffree), the same as the `stat -f` probe reports.
    assert (u.inodes_total, u.inodes_used, u.inodes_free) == (100, 60, 40)


def test_filesystems_without_inodes_have_no_inode_ratio():
    u = usage_from_statvfs(statvfs_result(files=0, ffree=0, favail=0))
    assert u.inodes_used_ratio is None  # btrfs, zfs, many FUSE filesystems
    assert usage_from_statvfs(statvfs_result(blocks=0, bfree=0, bavail=0)).used_ratio == 0.0


@pytest.mark.parametrize("tmpfs_mount", [8 * 2**20], indirect=True)
def test_real_tmpfs_matches_df(tmpfs_mount):
    (tmpfs_mount / "a").write_bytes(b"x" * 3 * 2**20)
    for i in range(50):
        (tmpfs_mount / f"f{i}").touch()
    out = subprocess.run(["df", "-B1", "--output=size,used,avail,itotal,iused,iavail", str(tmpfs_mount)],
                         capture_output=True, text=True, check=True).stdout.splitlines()[1].split()
    size, used, avail, itotal, iused, iavail = map(int, out)
    u = usage_from_statvfs(os.statvfs(tmpfs_mount))
    assert (u.size_bytes, u.used_bytes, u.avail_bytes) == (size, used, avail)
    assert (u.inodes_total, u.inodes_used, u.inodes_free) == (itotal, iused, iavail)


def mount(mp: str, fstype: str = "ext4", dev: int = 1, kind: MountKind = MountKind.LOCAL) -> Mount:
    return Mount(mount_point=mp, fstype=fstype, source=f"src{dev}", major=8, minor=dev, kind=kind)


class FakeHost:
    """A mount table and a statvfs the test steers: per mount a result, an error, or a block."""

    def __init__(self, *mounts: Mount):
        self.mounts = list(mounts)
        self.results = {m.mount_point: statvfs_result() for m in mounts}
        self.errors: dict[str, BaseException] = {}
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.calls: Counter[str] = Counter()

    def read_mounts(self, _proc_root: str) -> list[Mount]:
        return list(self.mounts)

    def block(self, mp: str) -> None:
        self.gates[mp] = threading.Event()
        self.entered[mp] = threading.Event()

    def release(self, mp: str) -> None:
        self.gates.pop(mp).set()

    def statvfs(self, mp: str) -> os.statvfs_result:
        self.calls[mp] += 1
        gate = self.gates.get(mp)
        if gate is not None:
            self.entered[mp].set()
            gate.wait(30)
        if mp in self.errors:
            raise self.errors[mp]
        return self.results[mp]


def sampler_for(host: FakeHost, **kw) -> FsSampler:
    kw.setdefault("timeout", 0.4)
    kw.setdefault("wait", 0.2)
    return FsSampler(clock=SystemClock(), statvfs=host.statvfs, read_mounts=host.read_mounts, **kw)


def by_mp(samples):
    return {s.mount.mount_point: s for s in samples}


def test_every_mount_is_sampled():
    host = FakeHost(mount("/"), mount("/data", "xfs", 2))
    host.results["/data"] = statvfs_result(bavail=0, bfree=0)
    samples, missing = sampler_for(host).sample()
    got = by_mp(samples)
    assert set(got) == {"/", "/data"} and missing == []
    assert got["/data"].usage.used_ratio == 1.0 and got["/data"].responsive


def test_blocked_statfs_is_reported_unresponsive_not_restarted_and_recovers():
    host = FakeHost(mount("/"), mount("/jfs", "fuse.juicefs", 2, MountKind.FUSE))
    sampler = sampler_for(host)
    sampler.sample()  # a first good reading of both
    host.block("/jfs")

    started = time.monotonic()
    samples, _ = sampler.sample()
    first = time.monotonic() - started
    assert host.entered["/jfs"].is_set()
    assert first < 0.2 + 0.15, "a cycle waits at most `wait` for its probes"
    jfs = by_mp(samples)["/jfs"]
    assert jfs.responsive, "not yet past the timeout: the last usage stands"
    assert jfs.usage is not None

    time.sleep(0.45)  # past the 0.4 s probe timeout
    started = time.monotonic()
    samples, _ = sampler.sample()
    later = time.monotonic() - started
    jfs, root = by_mp(samples)["/jfs"], by_mp(samples)["/"]
    assert not jfs.responsive and root.responsive
    assert time.time() - jfs.unresponsive_since >= 0.4, "says since when"
    assert later < 0.1, "an already stuck probe does not lengthen every later cycle"
    sampler.sample()
    assert host.calls["/jfs"] == 2, "the stuck probe is never started again"
    assert host.calls["/"] == 4

    host.release("/jfs")
    deadline = time.monotonic() + 5
    while True:
        jfs = by_mp(sampler.sample()[0])["/jfs"]
        if jfs.responsive or time.monotonic() > deadline:
            break
    assert jfs.responsive and jfs.usage is not None and jfs.unresponsive_since is None


def test_a_local_mount_that_blocks_the_shared_probe_gets_its_own_and_the_others_go_on():
    """Healthy local mounts share one probe thread; the one it gets stuck on is left to that thread
    and probed on its own from then on, the others go to a new one: no cycle waits for it."""
    host = FakeHost(mount("/"), mount("/a", "ext4", 2), mount("/b", "xfs", 3))
    sampler = sampler_for(host)
    sampler.sample()
    host.block("/a")
    started = time.monotonic()
    sampler.sample()
    assert time.monotonic() - started < 0.2 + 0.15, "a cycle waits at most `wait` for its probes"
    assert host.entered["/a"].wait(5)

    time.sleep(0.45)  # past the 0.4 s probe timeout
    host.results["/b"] = statvfs_result(bavail=7)
    started = time.monotonic()
    got = by_mp(sampler.sample()[0])
    assert time.monotonic() - started < 0.15, "the stuck mount is not waited for"
    assert not got["/a"].responsive and got["/a"].usage is not None
    assert got["/"].responsive and got["/b"].responsive
    assert got["/b"].usage.avail_bytes == 7 * 4096, "the mounts it had not reached are probed afresh"
    for _ in range(3):
        got = by_mp(sampler.sample()[0])
    assert host.calls["/a"] == 2, "the stuck probe is never started again"
    assert not got["/a"].responsive and got["/b"].responsive

    host.release("/a")
    deadline = time.monotonic() + 5
    while not by_mp(sampler.sample()[0])["/a"].responsive and time.monotonic() < deadline:
        time.sleep(0.01)
    host.results["/a"] = statvfs_result(bavail=5)
    deadline = time.monotonic() + 5
    while (a := by_mp(sampler.sample()[0])["/a"]).usage.avail_bytes != 5 * 4096 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.responsive and a.usage.avail_bytes == 5 * 4096, "recovered, and probed again (on its own)"


def test_first_probe_blocked_reports_nothing_until_the_timeout():
    host = FakeHost(mount("/nfs", "nfs4", 3, MountKind.NETWORK))
    host.block("/nfs")
    sampler = sampler_for(host)
    try:
        (s,) = sampler.sample()[0]
        assert s.usage is None and s.responsive
        time.sleep(0.45)
        (s,) = sampler.sample()[0]
        assert not s.responsive and s.usage is None
    finally:
        host.release("/nfs")


def test_statvfs_errors_are_reported_per_mount():
    host = FakeHost(mount("/"), mount("/mnt/nfs", "nfs4", 2, MountKind.NETWORK))
    host.errors["/mnt/nfs"] = OSError(errno.ESTALE, os.strerror(errno.ESTALE))
    got = by_mp(sampler_for(host).sample()[0])
    assert got["/mnt/nfs"].responsive and got["/mnt/nfs"].usage is None
    assert "Stale" in got["/mnt/nfs"].error and "116" in got["/mnt/nfs"].error
    assert got["/"].error is None


def test_an_unexpected_exception_in_a_probe_does_not_wedge_the_mount():
    host = FakeHost(mount("/odd", "ext4", 2))
    host.errors["/odd"] = ValueError("embedded null byte")
    sampler = sampler_for(host)
    (s,) = sampler.sample()[0]
    assert s.responsive and s.error and "embedded null byte" in s.error
    del host.errors["/odd"]
    (s,) = sampler.sample()[0]
    assert s.error is None and s.usage is not None, "probed again next cycle"


def test_mounts_that_appear_and_disappear_while_running():
    host = FakeHost(mount("/"))
    sampler = sampler_for(host)
    assert set(by_mp(sampler.sample()[0])) == {"/"}
    new = mount("/mnt/usb", "ext4", 5)
    host.mounts.append(new)
    host.results["/mnt/usb"] = statvfs_result(bavail=10)
    assert by_mp(sampler.sample()[0])["/mnt/usb"].usage.avail_bytes == 10 * 4096
    host.mounts.remove(new)
    assert set(by_mp(sampler.sample()[0])) == {"/"}


def test_a_hung_mount_that_is_unmounted_is_forgotten_and_a_new_mount_there_is_probed():
    host = FakeHost(mount("/"), mount("/nfs", "nfs4", 2, MountKind.NETWORK))
    sampler = sampler_for(host, timeout=0.1, wait=0.05)
    sampler.sample()
    host.block("/nfs")
    sampler.sample()
    time.sleep(0.15)
    assert not by_mp(sampler.sample()[0])["/nfs"].responsive
    host.mounts = [mount("/")]  # umount -l
    assert set(by_mp(sampler.sample()[0])) == {"/"}
    host.mounts = [mount("/"), mount("/nfs", "nfs4", 9, MountKind.NETWORK)]  # mounted again, new device
    host.gates.pop("/nfs").set()
    s = by_mp(sampler.sample()[0])["/nfs"]
    assert s.responsive and s.mount.minor == 9


def test_missing_configured_paths(tmp_path):
    present, absent = tmp_path / "ckpt", tmp_path / "logs"
    present.mkdir()
    host = FakeHost(mount("/"))
    sampler = sampler_for(host, paths=[str(present), str(absent)])
    assert sampler.sample()[1] == [str(absent)]
    absent.mkdir()
    assert sampler.sample()[1] == [], "a path that appears is no longer reported"


def test_real_mount_table_and_statvfs():
    samples, _ = FsSampler(clock=SystemClock()).sample()
    root = by_mp(samples).get("/")
    assert root is not None and root.responsive and root.usage.size_bytes > 0


@pytest.mark.skipif(shutil.which("stat") is None, reason="no stat command (coreutils or busybox)")
def test_child_probe_reads_what_statvfs_reads(tmp_path):
    """Network and FUSE mounts are probed through a `stat -f` child: same numbers, same missing paths."""
    (tmp_path / "sub dir").mkdir()
    present, absent = str(tmp_path / "sub dir"), str(tmp_path / "absent")
    root = mount(str(tmp_path), "nfs4", 7, MountKind.NETWORK)
    result = child_probe(shutil.which("stat"))(root, [present, absent])
    st = os.statvfs(tmp_path)
    expected = usage_from_statvfs(st)
    assert result.error is None and result.missing == (absent,)
    assert (result.usage.size_bytes, result.usage.inodes_total) == (expected.size_bytes, expected.inodes_total)
    assert result.usage.fsid == st.f_fsid != 0  # one filesystem named alike by both probes
    assert abs(result.usage.avail_bytes - expected.avail_bytes) < 16 * 2**20  # the host's disk is live
    gone = child_probe(shutil.which("stat"))(mount(str(tmp_path / "gone"), "nfs4", 8, MountKind.NETWORK), [])
    assert gone.usage is None and gone.error == "No such file or directory (errno 2)"
