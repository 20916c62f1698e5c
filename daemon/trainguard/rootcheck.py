"""Which directories may ever be a cleanup root: the static rules, shared by config and cleanup.

Configuration checks a root's text with these at load time; cleanup checks it again, with the
real directory, before it opens it.
"""

from __future__ import annotations

import os
import pwd
import stat
import threading
from typing import Iterable

# Directories that are never a cleanup root themselves (their children may be).
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/usr", "/var",
    "/var/lib", "/var/log", "/var/cache", "/usr/local", "/usr/lib", "/usr/share", "/usr/bin",
})
# Trees never cleaned anywhere below them, whatever the root is.
FORBIDDEN_TREES = ("/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib64")


class UnsafeRoot(ValueError):
    """A configured root that cleanup refuses to work in."""


def home_dirs(passwd: Iterable[pwd.struct_passwd] | None = None) -> frozenset[str]:
    homes = {"/root"}
    try:
        entries = list(passwd) if passwd is not None else pwd.getpwall()
    except OSError:  # pragma: no cover - no passwd database at all
        entries = []
    for entry in entries:
        if entry.pw_dir and entry.pw_dir.startswith("/"):
            homes.add(os.path.normpath(entry.pw_dir))
    return frozenset(homes)


def check_root_text(root: str, homes: frozenset[str] | None = None) -> str:
    """Static checks (config time): absolute, normalised, not a system or home directory.

    Returns the normalised path; raises UnsafeRoot with the reason.
    """
    if "\0" in root:
        raise UnsafeRoot(f"root {root!r} contains a NUL byte")
    if not root or not root.startswith("/"):
        raise UnsafeRoot(f"root {root!r} must be an absolute path")
    if any(part == ".." for part in root.split("/")):
        raise UnsafeRoot(f"root {root!r} must not contain '..'")
    norm = os.path.normpath(root)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm in SYSTEM_DIRS:
        raise UnsafeRoot(f"root {norm!r} is a system directory; name a directory below it")
    for tree in FORBIDDEN_TREES:
        if norm == tree or norm.startswith(tree + "/"):
            raise UnsafeRoot(f"root {norm!r} is inside {tree}, which cleanup never touches")
    homes = home_dirs() if homes is None else homes
    if norm in homes or os.path.dirname(norm) == "/home":
        raise UnsafeRoot(f"root {norm!r} is a home directory itself; name a directory inside it")
    return norm


def check_root_on_disk(norm: str, timeout: float = 2.0) -> None:
    """Config-time look at the root itself: refuse a symlink (to / or anywhere) and a non-directory.

    The lstat runs on a helper thread: a root below a hung share is left to the run-time
    check (which refuses it too) instead of hanging the configuration load.
    """
    result: list[os.stat_result | OSError] = []
    worker = threading.Thread(target=lambda: result.append(_lstat(norm)), name="rootcheck", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result or isinstance(result[0], OSError):
        return  # missing (may be created later), unreadable or not answering: checked again at run time
    st = result[0]
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(norm)
        except OSError:
            target = "?"
        raise UnsafeRoot(f"root {norm!r} is a symlink (to {target!r}); configure the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRoot(f"root {norm!r} is not a directory")


def _lstat(path: str) -> os.stat_result | OSError:
    try:
        return os.lstat(path)
    except OSError as exc:
        return exc
