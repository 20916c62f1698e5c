"""Real, small filesystems for tests that must watch a disk fill up.

``tmpfs(size)`` and ``loop_ext4(size)`` mount a fresh filesystem on a temporary
directory and always unmount it (and detach the loop device) on the way out,
even when the test body raises.  Both need root; ``root_reason()`` says why
they cannot be used, for ``pytest.skip``.  ``fill()`` writes until a byte count
or ENOSPC, so a test can drive a filesystem to a known usage.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

_CMD_TIMEOUT_S = 30.0
_reason_cache: dict[bool, str | None] = {}


class MountError(RuntimeError):
    """A mount helper command failed; the message carries the command and its stderr."""


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=_CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MountError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise MountError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def root_reason(need_loop: bool = False) -> str | None:
    """Return why test mounts cannot be made here, or None when they can.

    Checks root, that a tmpfs can really be mounted, and with ``need_loop``
    also mkfs.ext4, losetup and a loop device.  Cached per argument.
    """
    if need_loop not in _reason_cache:
        _reason_cache[need_loop] = _root_reason(need_loop)
    return _reason_cache[need_loop]


def _root_reason(need_loop: bool) -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root: mounting tmpfs/loop filesystems needs root"
    for tool in ("mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} not found (install util-linux)"
    try:
        with tmpfs(1 << 20):
            pass
    except MountError as exc:
        return f"cannot mount a tmpfs (in a container? needs CAP_SYS_ADMIN): {exc}"
    if need_loop:
        for tool, package in (("mkfs.ext4", "e2fsprogs"), ("losetup", "util-linux")):
            if shutil.which(tool) is None:
                return f"{tool} not found (install {package})"
        if not os.path.exists("/dev/loop-control"):
            return "no /dev/loop-control: loop devices are not available"
        try:
            with loop_ext4(8 << 20):
                pass
        except MountError as exc:
            return f"cannot mount a loop ext4 filesystem: {exc}"
    return None


def _mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        return any(line.split()[4] == target for line in table)


def _unmount(path: Path) -> None:
    # A lazy unmount still detaches the tree when something holds a file open in it.
    for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
        if not _mounted(path):
            return
        with contextlib.suppress(MountError):
            _run(argv)


@contextlib.contextmanager
def tmpfs(size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` on a fresh temporary directory and yield it."""
    if size_bytes <= 0:
        raise ValueError(f"tmpfs size must be positive, got {size_bytes}")
    mountpoint = Path(tempfile.mkdtemp(prefix="tg-tmpfs-"))
    try:
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tg-test-tmpfs", str(mountpoint)])
        yield mountpoint
    finally:
        _unmount(mountpoint)
        with contextlib.suppress(OSError):
            mountpoint.rmdir()


@contextlib.contextmanager
def loop_ext4(size_bytes: int) -> Iterator[Path]:
    """Make an ext4 image of ``size_bytes``, loop-mount it and yield the mount point.

    No blocks are reserved for root (``-m 0``), so ``fill`` reaches ENOSPC at
    the capacity ``statvfs`` reports as available.
    """
    if size_bytes < (2 << 20):
        raise ValueError(f"loop ext4 size must be at least 2 MiB, got {size_bytes}")
    workdir = Path(tempfile.mkdtemp(prefix="tg-ext4-"))
    image, mountpoint = workdir / "disk.img", workdir / "mnt"
    mountpoint.mkdir()
    device = None
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "tg-test", str(image)])
        device = _run(["losetup", "--find", "--show", str(image)])
        _run(["mount", "-t", "ext4", device, str(mountpoint)])
        yield mountpoint
    finally:
        _unmount(mountpoint)
        if device:
            with contextlib.suppress(MountError):
                _run(["losetup", "-d", device])
        shutil.rmtree(workdir, ignore_errors=True)


def fill(path: str | os.PathLike[str], nbytes: int, chunk: int = 1 << 20) -> int:
    """Write to ``path`` (created or appended) until ``nbytes`` or ENOSPC; return bytes written.

    Data is fsynced, so it is really allocated (not only promised by a delayed
    allocation) when this returns.  Errors other than ENOSPC propagate.
    """
    if nbytes < 0 or chunk <= 0:
        raise ValueError(f"fill needs nbytes >= 0 and chunk > 0, got {nbytes}, {chunk}")
    block = memoryview(b"\xa5" * chunk)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while written < nbytes:
            try:
                n = os.write(fd, block[:min(chunk, nbytes - written)])
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    break
                raise
            written += n
        try:
            os.fsync(fd)
        except OSError as exc:
            # ENOSPC can surface only here under delayed allocation; the count stays what write() took.
            if exc.errno != errno.ENOSPC:
                raise
    finally:
        os.close(fd)
    return written
