"""The one directory traversal of cleanup: scan(), a depth-first stack of open directories, each read
in batches of names (one getdents64 call, or a slice of a scandir without the compiled part). Every
directory is opened relative to its parent's fd (open_child), O_NOFOLLOW|O_DIRECTORY, and must still
be the inode listed, on the root's filesystem and mount: a symlink or a mount swapped in cannot
redirect it. Before each batch, in_place() notices a directory renamed out of the root (it is not
cleaned further). walk() hands the same traversal out entry by entry. Memory: one fd and batch a level.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from itertools import islice
from typing import Callable, Iterator, NamedTuple

try:
    from trainguard.actions.cleanup.engine._agescan import read_names
except ImportError:  # installed without a C compiler: scandir does the listing
    read_names = None

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# hook(event, relpath) where a concurrent change matters ("open_dir" before a subdirectory is opened,
# "batch" before a batch is judged): tests race the traversal there.
Hook = Callable[[str, str], None]


class Entry(NamedTuple):
    """One directory entry. dir_fd is only valid while the walk is positioned on it."""

    dir_fd: int
    name: str
    path: str  # relative to the walk root, "/"-joined
    st: os.stat_result  # lstat: never the target of a symlink
    is_dir: bool
    post: bool = False  # True: the directory's contents have all been yielded


class WalkProblem(NamedTuple):
    path: str
    reason: str  # "permission", "vanished", "symlink", "other-filesystem", "mount-point", "moved", "error"
    detail: str

    @classmethod
    def of(cls, path: str, exc: OSError) -> WalkProblem:
        return cls(path or ".", classify_error(exc), exc.strerror or str(exc))


def mount_id(fd: int) -> int | None:
    """The mount an open fd lives on (mnt_id in /proc/self/fdinfo, mountinfo's first field): unlike st_dev,
    it tells a bind mount from its filesystem. None when /proc is not readable (only st_dev is checked)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
            for line in fh:
                if line.startswith(b"mnt_id:"):
                    return int(line[7:])
    except (OSError, ValueError):
        pass
    return None


def check_same_mount(fd: int, expect_mnt: int | None, name: str) -> None:
    """Raise EXDEV when fd is not on the mount expect_mnt (a mount point, e.g. a bind mount)."""
    if expect_mnt is not None and mount_id(fd) not in (expect_mnt, None):
        raise OSError(errno.EXDEV, "is a mount point (another mount is attached there)", name)


def open_dir_at(parent_fd: int, name: str, expect_dev: int, expect_mnt: int | None = None,
                expect_ino: int | None = None) -> int:
    """Open a child directory relative to parent_fd, refusing symlinks, other filesystems,
    (given expect_mnt) mount points of the same filesystem and (given expect_ino, the inode
    listed) a directory replaced since it was listed."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        st = os.fstat(fd)
        if st.st_dev != expect_dev:
            raise OSError(errno.EXDEV, "directory is on another filesystem", name)
        if expect_ino is not None and st.st_ino != expect_ino:
            raise OSError(errno.ENOENT, "directory was replaced during the scan", name)
        check_same_mount(fd, expect_mnt, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(root_fd: int, relpath: str, expect_dev: int, expect_mnt: int | None) -> int:
    """Open relpath's directory chain below root_fd one component at a time (no symlinks, one filesystem,
    one mount: expect_mnt, the one root_fd is on, as the caller knows it from opening the root)."""
    fd = os.dup(root_fd)
    try:
        for part in relpath.split("/") if relpath else ():
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "unexpected path component", relpath)
            child = open_dir_at(fd, part, expect_dev, expect_mnt)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def classify_error(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission"
    if exc.errno == errno.EROFS:
        return "read-only"
    if exc.errno in (errno.ENOENT, errno.ESTALE):
        return "vanished"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "symlink"  # O_NOFOLLOW|O_DIRECTORY on something that is no longer a directory
    if exc.errno == errno.EXDEV:
        return "mount-point" if "mount point" in (exc.strerror or "") else "other-filesystem"
    return "error"


READ_BYTES = 32768  # one getdents64 call: up to ~1000 names a batch, so memory stays flat on any directory


class Listing:
    """One directory of a scan(): read it with read(), in batches, after asking in_place()."""

    __slots__ = ("fd", "path", "name", "st", "parent", "place", "enter", "done", "entries", "data")

    def __init__(self, fd: int, path: str, name: str, st: os.stat_result, parent: Listing | None,
                 place: bytes | None):
        self.fd = fd
        self.path = path  # relative to the scan root, "" for the root itself
        self.name = name  # in its parent
        self.st = st  # fstat of the opened directory, taken before it was read
        self.parent = parent
        self.place = place  # where the kernel says it is (/proc/self/fd), None: unknown
        self.enter: tuple[str, int] | None = None  # set by the caller: descend into (name, inode listed)
        self.done = False  # yielded once more after its contents (scan(post=True)), fd closed
        self.entries: Iterator[os.DirEntry[str]] | None = None  # the scandir batches come from, without getdents
        self.data = None  # the caller's state for this directory

    @property
    def prefix(self) -> str:
        return self.path + "/" if self.path else ""

    def read(self, size: int = READ_BYTES) -> list[str]:
        """The next batch of names, [] at the end."""
        if read_names is not None:
            return read_names(self.fd, size)
        if self.entries is None:
            self.entries = os.scandir(self.fd)
        return [e.name for e in islice(self.entries, max(1, size // 32))]


def place_of(fd: int) -> bytes | None:
    try:
        return os.readlink(b"/proc/self/fd/%d" % fd)
    except OSError:
        return None


def in_place(lst: Listing) -> bool:
    """Whether the directory is still where the scan entered it below its root: not renamed out
    (itself or an ancestor), not removed. One readlink of /proc/self/fd; without /proc, one
    fstatat per level up to the root."""
    if lst.place is not None and (now := place_of(lst.fd)) is not None:
        return now == lst.place
    while lst.parent is not None:
        try:
            st = os.stat(lst.name, dir_fd=lst.parent.fd, follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != (lst.st.st_dev, lst.st.st_ino):
            return False
        lst = lst.parent
    return True


def _close_listing(lst: Listing) -> None:
    if lst.entries is not None:
        lst.entries.close()
    if lst.parent is None:  # a dup of the caller's root fd: the read offset is shared with it
        os.lseek(lst.fd, 0, os.SEEK_SET)
    os.close(lst.fd)


def open_child(here: Listing, name: str, ino: int, *, dev: int, mnt: int | None, hook: Hook | None) -> Listing:
    """The subdirectory name (the inode listed) of an open listing, opened as scan() enters it."""
    path = here.prefix + name
    if hook is not None:
        hook("open_dir", path)
    child = open_dir_at(here.fd, name, dev, mnt, ino)
    place = None if here.place is None else here.place.rstrip(b"/") + b"/" + os.fsencode(name)
    try:
        return Listing(child, path, name, os.fstat(child), here, place)
    except BaseException:
        os.close(child)
        raise


def scan(root_fd: int, *, dev: int, on_problem: Callable[[WalkProblem], None], hook: Hook | None = None,
         mnt: int | None = None, post: bool = False) -> Iterator[Listing]:
    """Depth-first traversal handing out whole directories, so the per-entry loop is the caller's.

    Protocol: for each yielded listing, read batches (lst.read()); to descend into a subdirectory
    set lst.enter = (name, inode) and take the next listing (the child, by open_child), later the
    parent again; to finish the directory, leave enter unset. With post, a finished directory below
    the root comes once more with done set (its fd closed, its parent's open: rmdir relative to
    it). Opening problems go to on_problem.
    """
    first = os.dup(root_fd)
    try:
        os.lseek(first, 0, os.SEEK_SET)
        root = Listing(first, "", "", os.fstat(first), None, place_of(first))
    except OSError as exc:
        os.close(first)
        on_problem(WalkProblem.of(".", exc))
        return
    stack = [root]
    try:
        while stack:
            here = stack[-1]
            yield here
            enter, here.enter = here.enter, None
            if enter is None:
                stack.pop()
                _close_listing(here)
                if post and here.parent is not None:
                    here.done = True
                    yield here
                continue
            try:
                stack.append(open_child(here, *enter, dev=dev, mnt=mnt, hook=hook))
            except OSError as exc:
                on_problem(WalkProblem.of(here.prefix + enter[0], exc))
    finally:
        for here in reversed(stack):
            _close_listing(here)


def moved(lst: Listing) -> WalkProblem:
    """The problem reported for a directory that left the root during the run."""
    return WalkProblem(lst.path or ".", "moved", "left its place below the root during the run")


def walk(root_fd: int, *, dev: int, descend: Callable[[Entry], bool] | None = None,
         prune_paths: frozenset[str] = frozenset(), post_order: bool = False,
         on_problem: Callable[[WalkProblem], None] | None = None, hook: Hook | None = None,
         mnt: int | None = None) -> Iterator[Entry]:
    """scan(), entry by entry: every entry below root_fd (its lstat), directories before their contents,
    entered when descend(entry) says so (default: yes). prune_paths (mount points below the root) are
    never yielded nor entered; entries on another device are reported, as is a directory that left
    the root. With post_order, each entered directory comes again after its contents (post=True,
    dir_fd its parent's). The caller must not keep dir_fd past the next iteration."""
    problem = on_problem or (lambda p: log.warning("cleanup walk: skipping %s (%s: %s)", p.path, p.reason, p.detail))
    for lst in scan(root_fd, dev=dev, on_problem=problem, hook=hook, mnt=mnt, post=post_order):
        if lst.done:
            yield lst.data[1]._replace(dir_fd=lst.parent.fd, post=True)
            continue
        if lst.data is None:  # first visit: [names of the batch not yet yielded, its own entry, the entry entered]
            lst.data = [[], lst.parent.data[2] if lst.parent is not None else None, None]
        while (entry := (yield from _walk_listing(lst, dev, prune_paths, problem))) is not None:
            if descend is None or descend(entry):
                lst.data[2] = entry
                lst.enter = (entry.name, entry.st.st_ino)
                break


def _walk_listing(lst: Listing, dev: int, prune_paths: frozenset[str], problem: Callable[[WalkProblem], None]):
    """Yield lst's entries until a directory (returned, to descend into) or the end (None)."""
    pending = lst.data[0]
    while True:
        if not pending:
            try:
                if not in_place(lst):
                    problem(moved(lst))
                    return None
                pending[:] = reversed(lst.read())
            except OSError as exc:  # getdents failed (e.g. the directory was removed under us)
                problem(WalkProblem.of(lst.path, exc))
                return None
            if not pending:
                return None
        name = pending.pop()
        path = lst.prefix + name
        if path in prune_paths:
            continue
        try:
            st = os.stat(name, dir_fd=lst.fd, follow_symlinks=False)
        except OSError as exc:
            problem(WalkProblem.of(path, exc))
            continue
        if st.st_dev != dev:
            problem(WalkProblem(path, "other-filesystem", "on another filesystem"))
            continue
        entry = Entry(lst.fd, name, path, st, stat.S_ISDIR(st.st_mode))
        yield entry
        if entry.is_dir:
            return entry
