"""Where a path is inside its filesystem: (the mount's device, the path from the filesystem's own top).

One file can be reached at several paths (a bind mount shows a directory of a filesystem at another
place; mountinfo's `root` field names that directory), so "is this file under that cleanup root" is
asked of these places, not of the paths: the file is under the root when both are on one filesystem
and the file's path in it is at or below the root's. The walk never enters another mount below a root
(walker.py), so the root's own mount is the only one to map.

Used for a loop image whose path is here but hidden by permissions (kernel_holders.py): where the
mapping cannot be trusted, the answer is None and the caller keeps everything (fail closed).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Sequence

from trainguard.actions.cleanup.engine.walker import mount_id
from trainguard.records import Mount
from trainguard.sources.mounts import containing_mount


@dataclass(frozen=True, slots=True)
class Place:
    dev: int  # the mount's device as mountinfo shows it (one per filesystem, whichever mount shows it)
    path: str  # from the top of that filesystem, normalised

    def holds(self, other: Place) -> bool:
        """Whether other is this place or below it."""
        return self.dev == other.dev and (other.path == self.path or
                                          other.path.startswith(self.path.rstrip("/") + "/"))


def place_in(mount: Mount, path: str) -> Place | None:
    """The place of path (a normalised absolute path on mount); None when mount's root is not a plain
    path of its filesystem (a bind mount of a directory deleted since: "/dir//deleted")."""
    rest = os.path.relpath(path, mount.mount_point)
    if rest.startswith("..") or not mount.root.startswith("/") or mount.root.endswith("//deleted"):
        return None
    return Place(os.makedev(mount.major, mount.minor), os.path.normpath(os.path.join(mount.root, rest)))


def root_place(path: str, mnt: int | None, mounts: Sequence[Mount]) -> Place | None:
    """The place of a cleanup root: its path on the mount its fd is on (mnt, walker.mount_id)."""
    if mnt is None:
        return None
    mount = next((m for m in mounts if m.mount_id == mnt), None)
    return place_in(mount, os.path.normpath(path)) if mount is not None else None


def hidden_place(path: str, mounts: Sequence[Mount]) -> Place | None:
    """The place of a file whose path is here but which this process may not look at (an ancestor
    directory it cannot search). Trusted only when that directory, the deepest one it can reach, is on
    the very mount the path's text maps to: not a mount shadowed by a later one, and no mount point
    in the part it cannot see. None otherwise (or the path is not absolute and normalised)."""
    if not path.startswith("/") or os.path.normpath(path) != path:
        return None
    mount = containing_mount(path, mounts)
    if mount is None or not mount.mount_id:
        return None
    reached = _deepest_reachable(path)
    if reached is None:
        return None
    try:
        fd = os.open(reached, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY)
    except OSError:
        return None  # changed meanwhile
    try:
        on = mount_id(fd)
    finally:
        os.close(fd)
    return place_in(mount, path) if on == mount.mount_id else None


def _deepest_reachable(path: str) -> str | None:
    """The deepest directory of path that lstat reaches, when the next component is hidden from this
    process (EACCES); None when a component is missing, a symlink or not a directory."""
    reached = "/"
    for name in path.strip("/").split("/"):
        nxt = os.path.join(reached, name)
        try:
            st = os.lstat(nxt)
        except OSError as exc:
            return reached if exc.errno in (errno.EACCES, errno.EPERM) else None
        if not stat.S_ISDIR(st.st_mode):
            return None  # a symlink on the way, or the file itself is reached: not hidden
        reached = nxt
    return None
