"""Files the kernel holds, not a process: the backing file of a loop device, an active swap file.

No process has them open or mapped, so /proc/PID/fd and maps cannot show them; yet deleting the
image behind a mounted loop device loses its data once it is unmounted, and an active swap file
cannot be deleted at all (EPERM). inuse.OpenFiles keeps them like open files, by (st_dev, st_ino):

- loop devices: /sys/block/loopN/loop/backing_file says which file (its path as of now: it follows
  renames and reads "... (deleted)" once unlinked) and whether it is attached; its identity comes
  from the loop driver (LOOP_GET_STATUS64 on /dev/loopN: lo_device, lo_inode), right even when the
  path is deleted or seen from another mount namespace. Without /dev/loopN (a container), from an
  lstat of the path, trusted only when the file there has the loop's size (sysfs: size, loop/offset,
  loop/sizelimit). Otherwise (the path shows the host's view, or another file stands there; sysfs
  has no inode) the holder is unidentified: it could be any file on any filesystem, so it is
  `unknown` everywhere (ANYWHERE) and cleanup leaves every root alone until it can be identified,
  with one warning per loop device naming it (fail closed: a guess here deletes a mounted image).
  A path that is here but hidden by permissions (a daemon without root, the image in a root-only
  directory) narrows that to the roots that hold the path: its place in its filesystem (fsplace.py,
  through mountinfo, so a bind mount of one of its directories counts) at or below a root's. A path
  that cannot be placed ("(deleted)", not here, a mount point or a shadowed mount on the way) stays
  ANYWHERE;
- swap files: /proc/swaps, type "file", identified by an lstat of the path.

Either way the identity is an attribute lookup on the backing file's filesystem. A local one answers
from memory; a network or FUSE one may hang (DESIGN: the in-use check must not hang on a share), so
there the lookup runs on a helper thread, is waited for ANSWER seconds, and is not asked again while
it has not answered. Such a holder is `unknown`, by the device of the mount its path is on; cleanup
leaves a root on that filesystem alone until it answers.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
import threading
from dataclasses import dataclass
from typing import Callable

from trainguard.actions.cleanup.safety.fsplace import Place, hidden_place, root_place
from trainguard.records import Mount, MountKind
from trainguard.sources.mounts import containing_mount, read_mounts, unescape

log = logging.getLogger(__name__)

LOOP_GET_STATUS64 = 0x4C05
_LOOP_INFO64 = struct.Struct("=QQ")  # struct loop_info64 begins with lo_device, lo_inode
_LOOP_INFO64_SIZE = 232
DELETED = " (deleted)"
ANSWER = 1.0  # seconds a network or FUSE filesystem gets to say a backing file's device and inode
ANYWHERE = -1  # `unknown`'s key for a holder that could be on any filesystem
_MAY_HANG = (MountKind.NETWORK, MountKind.FUSE)


@dataclass(frozen=True, slots=True)
class KernelHolder:
    dev: int
    ino: int
    what: str  # "backing file of /dev/loop1 (mounted on /mnt/data)", "active swap file"


@dataclass(frozen=True, slots=True)
class Unknowns:
    """What the kernel holds that could not be identified: by device (ANYWHERE: on any), and the hidden
    images by their place, with the mount table they were placed by (to place the roots asked about)."""

    by_dev: dict[int, str]
    hidden: tuple[tuple[Place, str], ...] = ()
    mounts: tuple[Mount, ...] = ()

    def about(self, dev: int, path: str, mnt: int | None) -> str | None:
        """What could be under the root at path (on device dev, its fd on mount mnt), else None."""
        held = self.by_dev.get(dev) or self.by_dev.get(ANYWHERE)
        if held or not self.hidden:
            return held
        root = root_place(path, mnt, self.mounts)
        return next((what for place, what in self.hidden if root is None or root.holds(place)), None)


class KernelHolders:
    """Reads the kernel's holders; keeps the questions still out to a filesystem that did not answer."""

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys", dev_root: str = "/dev"):
        self.proc_root, self.sys_root, self.dev_root = proc_root, sys_root, dev_root
        self._asking: dict[str, _Question] = {}
        self._told: dict[str, str] = {}  # loop device -> backing path, warned about as unidentified

    def read(self) -> tuple[list[KernelHolder], Unknowns]:
        """(the holders identified, what could not be: on a mount that did not answer, or unidentified)."""
        loops, swaps = self._loops(), self._swaps()
        if not loops and not swaps:
            self._told = {}
            return [], Unknowns({})  # the usual case: no mount table read
        try:
            mounts = read_mounts(self.proc_root, own=True)
        except OSError:
            mounts = []
        found = [(path, _loop_what(name, mounts), lambda n=name, p=path: self._loop_identity(n, p, mounts))
                 for name, path in loops]
        found += [(path, "active swap file", lambda p=path: _lstat_identity(p)) for path in swaps]
        held: list[KernelHolder] = []
        unknown: dict[int, str] = {}
        hidden: list[tuple[Place, str]] = []
        unidentified: dict[str, str] = {}
        for path, what, identify in found:
            mount = containing_mount(path.removesuffix(DELETED), mounts) if path.startswith("/") else None
            if mount is not None and mount.kind in _MAY_HANG:
                ident = self._ask(path, identify)
                if ident is None:
                    unknown[os.makedev(mount.major, mount.minor)] = f"{what}: {path}"
                    continue
            else:
                try:
                    ident = identify()
                except OSError as exc:
                    ident = exc
            if isinstance(ident, Unidentified):
                unidentified[ident.device] = path
                held_as = f"{what}: {path} (which file it is cannot be told from here)"
                if ident.place is None:
                    unknown.setdefault(ANYWHERE, held_as)
                else:  # hidden by permissions, yet placed: only the roots holding that place could hold it
                    hidden.append((ident.place, held_as))
                continue
            if isinstance(ident, OSError):  # detached, or the swap file gone, meanwhile
                log.debug("cleanup: cannot identify the %s %s: %s", what, path, ident)
                continue
            held.append(KernelHolder(ident[0], ident[1], what))
        self._tell(unidentified)
        return held, Unknowns(unknown, tuple(hidden), tuple(mounts))

    def _tell(self, unidentified: dict[str, str]) -> None:
        """One warning per loop device whose backing file cannot be identified, until that changes."""
        for device, path in unidentified.items():
            if self._told.get(device) != path:
                log.warning("cleanup: cannot tell which file %s is backed by (%s: %s cannot be opened here, and no "
                            "file with the loop's size stands at that path); cleanup roots where it could be "
                            "are left alone while it is attached. Give trainguard %s (read-only), or see the image at the same "
                            "path as the host does", device, path, device, device)
        self._told = unidentified

    def _loop_identity(self, name: str, path: str, mounts: list[Mount]) -> tuple[int, int]:
        """(st_dev, st_ino) of loopN's backing file, from the driver; else from its path when the file
        there has the loop's size; else Unidentified (placed when the path is hidden by permissions).
        ENXIO: detached meanwhile."""
        device = os.path.join(self.dev_root, name)
        try:
            return _driver_identity(device, _read(os.path.join(self.sys_root, "block", name, "dev")))
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise  # detached meanwhile
            # no such node here (a container), not allowed to open it, or a node of another device
        hidden = False
        if not path.endswith(DELETED):
            try:
                st = os.lstat(path)
            except OSError as exc:
                st, hidden = None, exc.errno in (errno.EACCES, errno.EPERM)
            if st is not None and stat.S_ISREG(st.st_mode) and _loop_size_fits(self.sys_root, name, st.st_size):
                return st.st_dev, st.st_ino
        if not os.path.exists(os.path.join(self.sys_root, "block", name, "loop", "backing_file")):
            raise OSError(errno.ENXIO, "detached", device)
        raise Unidentified(f"/dev/{name}", hidden_place(path, mounts) if hidden else None)

    def _loops(self) -> list[tuple[str, str]]:
        """(loopN, backing file path) of every attached loop device."""
        base = os.path.join(self.sys_root, "block")
        try:
            names = sorted(n for n in os.listdir(base) if n.startswith("loop"))
        except OSError:
            return []
        found = []
        for name in names:
            try:
                with open(os.path.join(base, name, "loop", "backing_file"), encoding="utf-8",
                          errors="surrogateescape") as fh:
                    found.append((name, fh.read().rstrip("\n")))
            except OSError:
                continue  # not attached
        return found

    def _swaps(self) -> list[str]:
        try:
            with open(os.path.join(self.proc_root, "swaps"), encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            return []
        return [unescape(parts[0]) for parts in map(str.split, lines) if len(parts) >= 2 and parts[1] == "file"]

    def _ask(self, key: str, identify: Callable[[], tuple[int, int]]) -> tuple[int, int] | OSError | None:
        """identify() on a helper thread: its answer, or None while it has not answered. A new question is
        waited for ANSWER seconds; one still out from an earlier reading is not waited for again."""
        question = self._asking.get(key)
        if question is None:
            question = self._asking[key] = _Question(identify)
            question.done.wait(ANSWER)
        if not question.done.is_set():
            if not question.told:
                question.told = True
                log.warning("cleanup: the filesystem of %s has not said in %.0f s which file it is; "
                            "roots on that filesystem are left alone until it does", key, ANSWER)
            return None
        del self._asking[key]
        return question.answer


def _loop_what(name: str, mounts: list[Mount]) -> str:
    """"backing file of /dev/loop1 (mounted on /mnt/data)": where it, or a partition of it, is mounted."""
    where = [m.mount_point for m in mounts
             if m.source == f"/dev/{name}" or (m.source.startswith(f"/dev/{name}p") and m.source[len(name) + 6:].isdigit())]
    return f"backing file of /dev/{name} " + (f"(mounted on {', '.join(where)})" if where else "(attached, not mounted)")


class _Question:
    def __init__(self, identify: Callable[[], tuple[int, int]]):
        self.done = threading.Event()
        self.answer: tuple[int, int] | OSError | None = None
        self.told = False  # the warning that it does not answer was logged
        threading.Thread(target=self._run, args=(identify,), name="cleanup-identify", daemon=True).start()

    def _run(self, identify: Callable[[], tuple[int, int]]) -> None:
        try:
            self.answer = identify()
        except OSError as exc:
            self.answer = exc
        self.done.set()


class Unidentified(OSError):
    """A loop device is attached, but which file backs it cannot be told from here."""

    def __init__(self, device: str, place: Place | None = None):
        super().__init__(errno.ENODEV, "backing file cannot be identified", device)
        self.device = device
        self.place = place  # its path is here, hidden by permissions: where it is in its filesystem


def _loop_size_fits(sys_root: str, name: str, size: int) -> bool:
    """Whether a file of size bytes is what loopN maps: its sectors from the offset (to sizelimit)."""
    base = os.path.join(sys_root, "block", name)
    try:
        sectors, offset, limit = (int(_read(os.path.join(base, *p))) for p in (("size",), ("loop", "offset"),
                                                                                ("loop", "sizelimit")))
    except (OSError, ValueError):
        return False
    mapped = size - offset if not limit else min(limit, size - offset)
    return mapped >= 0 and mapped // 512 == sectors


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read().strip()


def _driver_identity(device: str, numbers: str) -> tuple[int, int]:
    """(st_dev, st_ino) of a loop device's backing file, from the loop driver (LOOP_GET_STATUS64);
    numbers: the device's "major:minor" from sysfs, which the node opened must be."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        rdev = os.fstat(fd).st_rdev
        if f"{os.major(rdev)}:{os.minor(rdev)}" != numbers:
            raise OSError(errno.ENODEV, f"not the node of loop device {numbers}", device)
        info = bytearray(_LOOP_INFO64_SIZE)
        fcntl.ioctl(fd, LOOP_GET_STATUS64, info)
    finally:
        os.close(fd)
    return _LOOP_INFO64.unpack_from(info)  # lo_device is encoded as st_dev is


def _lstat_identity(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino

