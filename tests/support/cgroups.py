"""Real cgroups for tests: a test-private subtree of a cgroup hierarchy, processes moved into its leaves.

CgroupTree(root) makes <root>/trainguard-test-<pid>/..., creates nested directories named like a
runtime's (system.slice/docker-<id>.scope), moves a process into one by writing its PID to
cgroup.procs, and on close moves every process it placed back where this test process is and removes
the directories, deepest first. No controller is ever enabled, and only leaves hold processes.
"""

from __future__ import annotations

import os
from pathlib import Path


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3:
                out.append((fields[4].replace("\\040", " "), tail[0], tail[2]))
    return out


def cgroup2_root() -> str | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified (hybrid)."""
    for point, fstype, _ in _mounts():
        if fstype == "cgroup2":
            return point
    return None


def cgroup1_root(option: str = "pids") -> str | None:
    """Where the v1 hierarchy with this controller (or name=...) is mounted, if any."""
    for point, fstype, options in _mounts():
        if fstype == "cgroup" and option in options.split(","):
            return point
    return None


def cgroup_reason(version: int = 2) -> str | None:
    """Why real cgroups cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root: creating cgroups and moving processes needs root"
    root = cgroup2_root() if version == 2 else cgroup1_root()
    if root is None:
        return ("no cgroup v2 hierarchy mounted (/proc/self/mountinfo has no cgroup2)" if version == 2
                else "no cgroup v1 pids hierarchy mounted")
    if not os.access(os.path.join(root, "cgroup.procs"), os.W_OK):
        return f"{root} is not writable (read-only cgroupfs in this container)"
    return None


def _own_cgroup(root: str) -> str:
    """This process's cgroup directory in the hierarchy mounted at root (where children go back to)."""
    v2 = root == cgroup2_root()
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            if v2 and hierarchy == "0" and not controllers:
                break
            if not v2 and any(c in controllers.split(",") for c in ("pids",)):
                break
        else:
            path = "/"
    candidate = os.path.join(root, path.lstrip("/"))
    return candidate if os.path.isdir(candidate) and ".." not in path else root


class CgroupTree:
    def __init__(self, root: str):
        self.root = root
        self.base = Path(root) / f"trainguard-test-{os.getpid()}"
        self.home = _own_cgroup(root)
        self.placed: list[int] = []
        self.made: list[Path] = []

    def place(self, pid: int, relpath: str) -> Path:
        """Move pid into <base>/<relpath> (created; it must stay a leaf)."""
        leaf = self.make(relpath)
        (leaf / "cgroup.procs").write_text(f"{pid}\n")
        self.placed.append(pid)
        return leaf

    def relative(self, relpath: str) -> str:
        """The path /proc/PID/cgroup shows for <base>/<relpath> from the root cgroup namespace."""
        return "/" + str((self.base / relpath).relative_to(self.root))

    def make(self, relpath: str) -> Path:
        """Create <base>/<relpath> (and its parents) without moving anything into it."""
        leaf = self.base / relpath
        for directory in reversed([p for p in [leaf, *leaf.parents] if p == self.base or self.base in p.parents]):
            if not directory.exists():
                directory.mkdir()
                self.made.append(directory)
        return leaf

    def release(self) -> None:
        """Move every placed process back to this test process's own cgroup."""
        for pid in self.placed:
            try:
                Path(self.home, "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                pass  # exited meanwhile
        self.placed = []

    def close(self) -> None:
        """release(), then remove the directories, deepest first."""
        self.release()
        for directory in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            try:
                directory.rmdir()
            except OSError:
                pass
