"""Which roots cleanup may work in: never /, a system directory, a home directory itself, a symlink
or something that is not a directory (opened once, checked, then used by fd); and which mount points
lie below a root (never crossed, even bind mounts of the same filesystem, which share st_dev).

open_root() learns all of it once, into a Root that a run passes down as plain data: the walk, the
judges and every reopening below the root take its fd, device and mount from there.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from trainguard.actions.cleanup.engine.walker import mount_id
from trainguard.rootcheck import UnsafeRoot, check_root_text
from trainguard.sources.mounts import read_mounts


@dataclass(frozen=True, slots=True)
class OpenedRoot:
    """A root opened and checked, before its mount facts are read (open_root makes the Root of it)."""

    path: str  # the real, normalised path
    fd: int
    dev: int
    ino: int
    mnt: int | None = None  # its mount (walker.mount_id): the walk never enters another one


@dataclass(frozen=True, slots=True)
class Root:
    """A root opened for one run: the checked fd and what it is, its mount, the mount points below it."""

    path: str  # the real, normalised path
    fd: int
    dev: int
    ino: int
    mnt: int | None  # its mount (walker.mount_id): nothing below it on another one is entered
    mount: str  # the mount point holding it, for reports and the audit log
    below: frozenset[str]  # relative paths of mount points below the root: never entered


def open_root(root: str, homes: frozenset[str] | None, proc_root: str = "/proc") -> Root:
    """open_checked_root, then the mount facts of the root. Raises UnsafeRoot, or OSError when the
    mount table cannot be read; the caller closes .fd of what it returns."""
    o = open_checked_root(root, homes)
    try:
        below = mounts_below(o.path, proc_root)
    except BaseException:
        os.close(o.fd)
        raise
    return Root(o.path, o.fd, o.dev, o.ino, o.mnt, mount_point_of(o.path), below)


def open_checked_root(root: str, homes: frozenset[str] | None = None) -> OpenedRoot:
    """Runtime checks: exists, is a real directory reached without symlinks, passes the static checks.

    The caller closes .fd. A root reached through a symlink anywhere in its path is
    refused (the real path must be configured), so the path judged is the path cleaned.
    """
    norm = check_root_text(root, homes)
    real = os.path.realpath(norm)
    if real != norm:
        raise UnsafeRoot(f"root {norm!r} is reached through a symlink (it resolves to {real!r}); configure the real path")
    try:
        fd = os.open(norm, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafeRoot(f"root {norm!r} does not exist") from None
    except NotADirectoryError:
        raise UnsafeRoot(f"root {norm!r} is not a directory") from None
    except OSError as exc:
        raise UnsafeRoot(f"root {norm!r} cannot be opened: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - O_DIRECTORY already ensures it
        os.close(fd)
        raise UnsafeRoot(f"root {norm!r} is not a directory")
    # The path may have been swapped between realpath and open: confirm it is still the same object.
    try:
        again = os.stat(norm, follow_symlinks=False)
    except OSError:
        again = None
    if again is None or (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or os.path.realpath(norm) != norm:
        os.close(fd)
        raise UnsafeRoot(f"root {norm!r} changed while it was being opened")
    return OpenedRoot(norm, fd, st.st_dev, st.st_ino, mount_id(fd))


def mount_points(proc_root: str = "/proc") -> list[str]:
    """Mount points in this process's mount namespace, from <proc_root>/self/mountinfo."""
    return [m.mount_point for m in read_mounts(proc_root, own=True)]


def mounts_below(root: str, proc_root: str = "/proc") -> frozenset[str]:
    """Relative paths (to root) of mount points strictly below root: bind mounts included."""
    prefix = root.rstrip("/") + "/"
    return frozenset(p[len(prefix):] for p in mount_points(proc_root) if p.startswith(prefix) and p != prefix)


def mount_point_of(path: str) -> str:
    """The mount point holding path (walk up until st_dev changes), for reports."""
    path = os.path.realpath(path)
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return path
    while path != "/":
        parent = os.path.dirname(path)
        try:
            if os.stat(parent).st_dev != dev:
                return path
        except OSError:
            return path
        path = parent
    return "/"
