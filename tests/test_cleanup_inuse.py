"""What is in use is never deleted, whoever holds it: a process (fd or mapping, on every filesystem:
ext4, btrfs subvolumes, overlayfs) or the kernel (the image behind a loop device, mounted or only
attached; an active swap file). Real loop devices, mounts and swap, as root."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trainguard.actions.cleanup.engine import agepass
from trainguard.actions.cleanup.safety.inuse import OpenFiles

from tests.support.mounts import root_reason
from tests.test_cleanup import DAY, holder, make, names, policy, runner
from tests.test_cleanup_attacks import write_config
from tests.support.cli import trainguard

MODES = {"one-pass": dict(max_delete=False), "guarded": dict(max_delete=10000), "dry-run": dict(max_delete=10000)}
AGE = dict(type="age", age_by=["mtime"], older_than="7d", grace="0s")
BUILT = agepass.ENABLED  # before any test turns it off


def _sh(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _needs_loop() -> None:
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)


@contextlib.contextmanager
def attached(image: Path):
    """The image attached to a free loop device (detached on the way out): /dev/loopN."""
    device = _sh("losetup", "--find", "--show", str(image))
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60)


@contextlib.contextmanager
def mounted(source: str, target: Path, *args: str):
    target.mkdir(parents=True, exist_ok=True)
    _sh("mount", *args, source, str(target))
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], capture_output=True, timeout=60).returncode:
            subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=60)


def ext4_image(path: Path, size: int = 20 << 20) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(path))
    return path


def aged(path: Path, days: float = 30) -> Path:
    """Make path look unused for days (mtime and atime), as a dataset image left alone for a month."""
    os.sync()  # what mounting wrote lands first, so nothing moves the times back afterwards
    then = os.stat(path).st_mtime - days * DAY
    os.utime(path, (then, then))
    return path


# Python's mmap keeps a dup of the fd, so tests.test_cleanup.holder(path, "mmap") still has the file open:
# this one maps it through libc and closes its only fd, as a safetensors or np.memmap reader may.
MAP_AND_CLOSE = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
assert libc.mmap(None, os.fstat(fd).st_size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) not in (None, 2**64 - 1)
os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def mapped_and_closed(path: Path):
    proc = subprocess.Popen([sys.executable, "-c", MAP_AND_CLOSE, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        fds = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert str(path) not in fds and any(str(path) in line for line in open(f"/proc/{proc.pid}/maps"))
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(10)


def _judge(monkeypatch, judge: str) -> None:
    if judge == "compiled" and not BUILT:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", judge == "compiled")


def _run(tmp_path, root: Path, mode: str, **kw):
    return runner(tmp_path, DAY).run(policy(roots=[str(root)], **dict(AGE, **MODES[mode], **kw)),
                                     dry_run=mode == "dry-run")


# ------------------------------------------------------------------ held by the kernel


@pytest.mark.parametrize("judge", ["compiled", "python"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("how", ["mounted", "attached"])
def test_the_image_behind_a_loop_device_is_kept(tmp_path, monkeypatch, how, mode, judge):
    _needs_loop()
    _judge(monkeypatch, judge)
    root = tmp_path / "scratch"
    image = ext4_image(root / "datasets" / "data.img")
    make(root / "datasets" / "old.log")
    with attached(image) as device, contextlib.ExitStack() as stack:
        if how == "mounted":
            stack.enter_context(mounted(device, tmp_path / "mnt"))
        aged(image)
        report = _run(tmp_path, root, mode)
        assert image.exists() and os.stat(image).st_nlink == 1
        assert report.skipped.get("in-use") == 1 and "open" not in report.skipped
        where = f"(mounted on {tmp_path / 'mnt'})" if how == "mounted" else "(attached, not mounted)"
        assert report.in_use == (f"backing file of {device} {where}: {image}",)
        assert report.files == 1 and (mode == "dry-run") == (root / "datasets" / "old.log").exists()
    assert not report.blocked


def test_the_cli_says_which_loop_device_keeps_an_image(tmp_path):
    _needs_loop()
    root = tmp_path / "scratch"
    image = ext4_image(root / "data.img")
    cfg = write_config(tmp_path, str(root), 'older_than = "7d"\n')
    with attached(image) as device, mounted(device, tmp_path / "mnt"):
        aged(image)
        dry = trainguard("cleanup", "--dry-run", "--config", str(cfg), timeout=120)
        real = trainguard("cleanup", "--config", str(cfg), timeout=120)
        assert image.exists()
    line = f"  kept: backing file of {device} (mounted on {tmp_path / 'mnt'}): {image}"
    for out in (dry, real):
        assert out.returncode == 0 and line in out.stdout.splitlines(), out.stdout + out.stderr
        assert "1 in use by the kernel" in out.stdout


@contextlib.contextmanager
def active_swap(path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root for swapon")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(bytes(16 << 20))  # no holes: the kernel refuses a sparse swap file
    path.chmod(0o600)
    _sh("mkswap", str(path))
    done = subprocess.run(["swapon", str(path)], capture_output=True, text=True, timeout=60)
    if done.returncode:
        pytest.skip(f"swapon is not permitted here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["swapoff", str(path)], capture_output=True, timeout=120)


@pytest.mark.parametrize("judge", ["compiled", "python"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_active_swap_file_is_kept_not_reported_as_a_permission_problem(tmp_path, monkeypatch, mode, judge):
    _judge(monkeypatch, judge)
    root = tmp_path / "scratch"
    with active_swap(root / "swapfile") as swap:
        aged(swap)
        report = _run(tmp_path, root, mode)
        assert swap.exists()
    assert report.skipped == {"in-use": 1} and report.in_use == (f"active swap file: {swap}",)
    assert not report.blocked  # the kernel refuses to unlink it (EPERM): never tried, so no false alarm


def test_a_loop_image_on_a_hung_share_neither_hangs_cleanup_elsewhere_nor_goes_from_the_share(tmp_path, slowfs):
    """Identifying a loop image asks its filesystem (LOOP_GET_STATUS64 stats the backing file): on a FUSE
    share that does not answer, cleanup of a local root still finishes; once it answers, the image stays."""
    _needs_loop()
    image = slowfs.mountpoint / "data.img"
    with open(image, "wb") as fh:
        fh.write(bytes(1 << 20))
    local = tmp_path / "scratch"
    make(local / "old.dat")
    with attached(image) as device:
        slowfs.block("getattr")
        done = []
        run = threading.Thread(target=lambda: done.append(
            runner(tmp_path, DAY).run(policy(roots=[str(local)], max_delete=False, **AGE))), daemon=True)
        run.start()
        run.join(30)
        hung = run.is_alive()
        slowfs.unblock("getattr")
        run.join(30)
        assert not hung, "cleanup of a local root waited for a hung share"
        assert done[0].files == 1 and not (local / "old.dat").exists()
        os.utime(image, (0, 0))
        report = runner(tmp_path, DAY).run(policy(roots=[str(slowfs.mountpoint)], max_delete=False, **AGE))
        assert image.exists() and report.in_use == (f"backing file of {device} (attached, not mounted): {image}",)


# ------------------------------------------------------------------ mapped and closed, on every filesystem


@pytest.mark.parametrize("judge", ["compiled", "python"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_mapped_and_closed_file_in_a_btrfs_subvolume_is_kept(tmp_path, monkeypatch, mode, judge):
    """/proc/PID/maps shows the filesystem's device; a subvolume's files stat with a device of their own."""
    _needs_loop()
    _judge(monkeypatch, judge)
    image = tmp_path / "btrfs.img"
    with open(image, "wb") as fh:
        fh.truncate(128 << 20)
    try:
        _sh("mkfs.btrfs", "-q", str(image))
    except (RuntimeError, FileNotFoundError) as exc:
        pytest.skip(f"cannot make a btrfs filesystem (install btrfs-progs): {exc}")
    with attached(image) as device, mounted(device, tmp_path / "mnt"):
        _sh("btrfs", "subvolume", "create", str(tmp_path / "mnt" / "sub"))
        root = tmp_path / "mnt" / "sub"
        held, free = make(root / "shard.safetensors", 8192), make(root / "old.bin")
        assert os.stat(root).st_dev != os.stat(tmp_path / "mnt").st_dev
        with mapped_and_closed(held):
            report = _run(tmp_path, root, mode)
            assert held.exists() and (mode == "dry-run") == free.exists()
        assert report.skipped == {"open": 1} and report.files == 1


@pytest.mark.parametrize("judge", ["compiled", "python"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_mapped_and_closed_file_on_overlayfs_is_kept(tmp_path, monkeypatch, mode, judge):
    if reason := root_reason():
        pytest.skip(reason)
    _judge(monkeypatch, judge)
    layers = {name: tmp_path / name for name in ("lower", "upper", "work")}
    for d in layers.values():
        d.mkdir()
    make(layers["lower"] / "weights.bin", 8192)
    make(layers["lower"] / "old.bin")
    opts = f"lowerdir={layers['lower']},upperdir={layers['upper']},workdir={layers['work']}"
    with mounted("overlay", tmp_path / "merged", "-t", "overlay", "-o", opts) as root:
        with mapped_and_closed(root / "weights.bin"):
            report = _run(tmp_path, root, mode)
            assert (root / "weights.bin").exists() and (mode == "dry-run") == (root / "old.bin").exists()
    assert report.skipped == {"open": 1} and report.files == 1


# ------------------------------------------------------------------ any holder, any mix


HOLDERS = ("none", "open", "mapped", "loop")


@settings(derandomize=True, max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(held=st.lists(st.sampled_from(HOLDERS), min_size=1, max_size=6), mode=st.sampled_from(sorted(MODES)),
       judge=st.sampled_from(["compiled", "python"]))
def test_a_file_held_by_any_holder_is_never_deleted(tmp_path_factory, monkeypatch, held, mode, judge):
    _needs_loop()
    _judge(monkeypatch, judge)
    base = tmp_path_factory.mktemp("held")
    root = base / "root"
    files = [make(root / f"d{i % 2}" / f"f{i}.{how}", 4096) for i, how in enumerate(held)]
    with contextlib.ExitStack() as stack:
        for path in files:
            how = path.suffix[1:]
            if how == "open":
                stack.enter_context(holder(path, how))
            elif how == "mapped":
                stack.enter_context(mapped_and_closed(path))
            elif how == "loop":
                stack.enter_context(attached(path))
        _run(base, root, mode)
        left = names(root)
    kept = {str(p.relative_to(root)) for p in files if p.suffix != ".none" or mode == "dry-run"}
    assert {n for n in left if "." in n} == kept


# ------------------------------------------------------------------ the index under threads


class _SpiedLock:
    """The index's lock, telling when a thread other than the first starts to wait for it."""

    def __init__(self, lock, arrived: threading.Event, first: list):
        self.lock, self.arrived, self.first = lock, arrived, first

    def __enter__(self):
        if self.first and threading.current_thread() is not self.first[0]:
            self.arrived.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_one_refresh_at_a_time_and_a_waiting_thread_reads_the_fresh_index():
    """Worker threads judge with one index: a thread finding it stale while another refreshes waits
    for that refresh instead of starting its own, then reads what that refresh built."""
    now = [5.0]
    files = OpenFiles(clock=lambda: now[0])
    refreshes, entered, arrived, first = [], threading.Event(), threading.Event(), []
    files._lock = _SpiedLock(files._lock, arrived, first)
    refresh = files.refresh

    def watched_refresh():
        refreshes.append(threading.current_thread())
        if len(refreshes) > 1:
            arrived.set()  # a second refresh started while the first runs: it would overwrite or be overwritten
        entered.set()
        assert arrived.wait(10)  # the second thread is at the lock (or, unlocked, in here) before this goes on
        refresh()

    files.refresh = watched_refresh
    one = threading.Thread(target=files.is_open, args=(0, 0))
    first.append(one)
    one.start()
    assert entered.wait(10)
    got = []
    two = threading.Thread(target=lambda: got.append(files.inodes_on(0)))
    two.start()
    one.join(10)
    two.join(10)
    assert refreshes == [one] and got and files._index.built_at == 5.0
