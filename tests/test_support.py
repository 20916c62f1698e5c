"""The test-support package does what suites built on it rely on: real blocking, real ENOSPC, real refusals."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.http_receiver import HttpReceiver
from tests.support.mounts import fill, loop_ext4, root_reason, tmpfs
from tests.support.slowfs import SlowFs, fuse_available, mount_entry

# Where the kernel parks a task waiting for a FUSE server's answer (the name depends on inlining).
FUSE_WAITS = {"request_wait_answer", "fuse_simple_request", "__fuse_simple_request", "fuse_request_wait"}


def _mounted(path: Path) -> bool:
    return mount_entry(path) is not None


def _task_state(tid: int) -> tuple[str, str]:
    """(state letter, wchan) of a thread of this process."""
    task = Path(f"/proc/self/task/{tid}")
    stat = (task / "stat").read_text()
    state = stat[stat.rindex(")") + 2]
    return state, (task / "wchan").read_text().strip()


class _Call(threading.Thread):
    """Run fn in a daemon thread, keeping its result or exception and its kernel thread id."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.done = threading.Event()

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc
        finally:
            self.done.set()


# --------------------------------------------------------------------------- slowfs

@pytest.mark.fuse
@pytest.mark.parametrize("slowfs", [{"name": "juicefs", "source": "JuiceFS:ckpt", "size": 64 * 2**20}],
                         indirect=True)
def test_slowfs_mimics_fstype_and_passes_files_through(slowfs):
    entry = mount_entry(slowfs.mountpoint)
    assert (entry["fstype"], entry["source"]) == ("fuse.juicefs", "JuiceFS:ckpt")

    (slowfs.mountpoint / "run").mkdir()
    (slowfs.mountpoint / "run" / "ckpt.tmp").write_bytes(b"w" * 300_000)
    os.rename(slowfs.mountpoint / "run" / "ckpt.tmp", slowfs.mountpoint / "run" / "ckpt.pt")
    assert (slowfs.backing_dir / "run" / "ckpt.pt").read_bytes() == b"w" * 300_000
    assert os.listdir(slowfs.mountpoint / "run") == ["ckpt.pt"]

    st = os.statvfs(slowfs.mountpoint)
    assert st.f_blocks * st.f_frsize == 64 * 2**20
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    assert 300_000 <= used < 2 * 2**20


@pytest.mark.fuse
def test_blocked_statfs_holds_the_caller_until_unblocked(slowfs):
    slowfs.block("statfs")
    call = _Call(os.statvfs, slowfs.mountpoint)
    call.start()
    slowfs.wait_blocked("statfs")
    assert not call.done.wait(0.3), "statvfs returned while statfs was blocked"

    slowfs.unblock("statfs")
    assert call.done.wait(5), "statvfs did not return after unblock"
    assert call.error is None and call.result.f_blocks * call.result.f_frsize == 100 * 2**20


@pytest.mark.fuse
def test_blocked_write_parks_the_thread_in_the_kernel(slowfs):
    fd = os.open(slowfs.mountpoint / "events.out.tfevents", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        slowfs.block("write")
        call = _Call(os.write, fd, b"x" * 4096)
        call.start()
        slowfs.wait_blocked("write")
        state, wchan = _task_state(call.native_id)
        assert state == "D" or wchan in FUSE_WAITS, (state, wchan)
        assert not call.done.is_set()

        slowfs.unblock("all")
        assert call.done.wait(5)
        assert call.result == 4096
    finally:
        os.close(fd)
    assert (slowfs.backing_dir / "events.out.tfevents").stat().st_size == 4096


@pytest.mark.fuse
def test_delay_and_fail_shape_each_operation(slowfs):
    (slowfs.mountpoint / "f").write_bytes(b"data")
    slowfs.delay("read", 0.4)
    started = time.monotonic()
    assert (slowfs.mountpoint / "f").read_bytes() == b"data"
    assert time.monotonic() - started >= 0.4
    slowfs.delay("read", 0)

    slowfs.fail("read", errno.EIO)
    with pytest.raises(OSError) as raised:
        (slowfs.mountpoint / "f").read_bytes()
    assert raised.value.errno == errno.EIO
    with pytest.raises(ValueError, match="unknown operation"):
        slowfs.block("mmap")


@pytest.mark.fuse
def test_teardown_with_a_caller_still_blocked_is_bounded(tmp_path):
    if reason := fuse_available():
        pytest.skip(reason)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    fs = SlowFs(mountpoint)
    with fs:
        fs.block("all")
        call = _Call(os.statvfs, mountpoint)
        call.start()
        fs.wait_blocked("statfs")
        pid, started = fs.pid, time.monotonic()
    assert time.monotonic() - started < 10
    assert call.done.wait(5), "the blocked caller was not released by teardown"
    assert not _mounted(mountpoint)
    assert not Path(f"/proc/{pid}").exists(), "the server process outlived teardown"


@pytest.mark.fuse
def test_killed_server_leaves_a_dead_mount_that_teardown_removes(tmp_path):
    if reason := fuse_available():
        pytest.skip(reason)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with SlowFs(mountpoint) as fs:
        pid = fs.pid
        fs.kill()
        with pytest.raises(OSError) as raised:
            os.statvfs(mountpoint)
        assert raised.value.errno == errno.ENOTCONN
    assert not _mounted(mountpoint)
    assert not Path(f"/proc/{pid}").exists(), "the killed server was not reaped"


# --------------------------------------------------------------------------- mounts

@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [4 * 2**20], indirect=True)
def test_tmpfs_fills_to_enospc(tmpfs_mount):
    written = fill(tmpfs_mount / "big", 64 * 2**20, chunk=256 * 1024)
    st = os.statvfs(tmpfs_mount)
    assert 3 * 2**20 < written <= 4 * 2**20
    assert st.f_bavail == 0
    assert fill(tmpfs_mount / "more", 1024) == 0


@pytest.mark.root
def test_fill_stops_at_the_requested_size(tmpfs_mount):
    assert fill(tmpfs_mount / "part", 1_500_000, chunk=1 << 20) == 1_500_000
    assert (tmpfs_mount / "part").stat().st_size == 1_500_000


@pytest.mark.root
def test_mounts_are_removed_even_when_the_body_fails():
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        with tmpfs(2**20) as small, loop_ext4(8 * 2**20) as disk:
            seen += [small, disk]
            image = disk.parent / "disk.img"
            raise RuntimeError("boom")
    assert not any(_mounted(p) for p in seen)
    loops = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, timeout=10)
    assert loops.stdout.strip() == ""


@pytest.mark.root
@pytest.mark.parametrize("ext4_mount", [16 * 2**20], indirect=True)
def test_loop_ext4_fills_to_enospc(ext4_mount):
    assert mount_entry(ext4_mount)["fstype"] == "ext4"
    available = os.statvfs(ext4_mount).f_bavail * os.statvfs(ext4_mount).f_frsize
    written = fill(ext4_mount / "big", 64 * 2**20)
    assert available - 2**20 <= written <= available
    assert fill(ext4_mount / "more", 2**20) < 64 * 1024


# --------------------------------------------------------------------------- http receiver

def _post(url: str, payload: dict, timeout: float = 5.0) -> int:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_receiver_records_requests_and_follows_the_failure_plan(http_receiver):
    http_receiver.fail_next(2, status=503)
    statuses = [_post(f"{http_receiver.url}/hook?team=ml&team=ops", {"n": i}) for i in range(3)]
    assert statuses == [503, 503, 200]
    requests = http_receiver.wait_for(3, timeout=1)
    assert [r.json()["n"] for r in requests] == [0, 1, 2]
    assert [r.status for r in requests] == [503, 503, 200]
    assert requests[0].method == "POST" and requests[0].path == "/hook"
    assert requests[0].query == {"team": ["ml", "ops"]}
    assert requests[0].headers["content-type"] == "application/json"
    assert requests[0].arrived_at <= requests[2].arrived_at


def test_receiver_hang_trips_client_timeouts(http_receiver):
    http_receiver.hang_next(1, seconds=5)
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        _post(http_receiver.url, {"slow": True}, timeout=0.3)
    assert _post(http_receiver.url, {"slow": False}) == 200
    with pytest.raises(TimeoutError, match="2 of 3"):
        http_receiver.wait_for(3, timeout=0.2)


def test_receiver_refuses_while_stopped_and_recovers_on_the_same_port():
    with HttpReceiver() as receiver:
        url = receiver.url
        receiver.stop()
        with pytest.raises(urllib.error.URLError) as raised:
            _post(url, {"down": True}, timeout=2)
        assert isinstance(raised.value.reason, ConnectionRefusedError)

        receiver.start()
        assert receiver.url == url
        assert _post(url, {"down": False}) == 200
        assert [r.json() for r in receiver.wait_for(1)] == [{"down": False}]


def test_wait_for_wakes_on_arrival_not_on_timeout(http_receiver):
    sender = threading.Timer(0.2, _post, args=(http_receiver.url, {"late": True}))
    sender.start()
    started = time.monotonic()
    http_receiver.wait_for(1, timeout=10)
    assert time.monotonic() - started < 5
    sender.join()
