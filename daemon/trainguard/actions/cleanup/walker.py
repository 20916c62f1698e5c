"""Streaming, fd-relative directory walk that never follows a symlink or leaves its filesystem.

Every directory is opened relative to its parent's fd with O_NOFOLLOW|O_DIRECTORY,
so replacing a directory by a symlink (or a mount) between listing and descending
cannot redirect the walk. Memory is bounded by tree depth, not tree size: one open
fd and one scandir iterator per level. Entries carry the fd of their parent so the
caller can unlink relative to it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Callable, Iterator, NamedTuple

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# hook(event, relpath) is called at the points where a concurrent change matters
# ("open_dir" before a subdirectory is opened); tests use it to race the walk.
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
    reason: str  # "permission", "vanished", "symlink", "other-filesystem", "error"
    detail: str


def mount_id(fd: int) -> int | None:
    """The mount an open fd lives on: the mnt_id of /proc/self/fdinfo, the first field of mountinfo.

    Unlike st_dev, it tells a bind mount of a directory of the same filesystem from that
    filesystem. None when /proc is not readable (then only st_dev is checked).
    """
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
            for line in fh:
                if line.startswith(b"mnt_id:"):
                    return int(line[7:])
    except (OSError, ValueError):
        return None
    return None


def check_same_mount(fd: int, expect_mnt: int | None, name: str) -> None:
    """Raise EXDEV when fd is not on the mount expect_mnt (a mount point, e.g. a bind mount)."""
    if expect_mnt is not None and mount_id(fd) not in (expect_mnt, None):
        raise OSError(errno.EXDEV, "is a mount point (another mount is attached there)", name)


def open_dir_at(parent_fd: int, name: str, expect_dev: int, expect_mnt: int | None = None) -> int:
    """Open a child directory relative to parent_fd, refusing symlinks, other filesystems and
    (given expect_mnt) mount points of the same filesystem."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        st = os.fstat(fd)
        if st.st_dev != expect_dev:
            raise OSError(errno.EXDEV, "directory is on another filesystem", name)
        check_same_mount(fd, expect_mnt, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(root_fd: int, relpath: str, expect_dev: int) -> int:
    """Open relpath's directory chain below root_fd one component at a time (no symlinks, one filesystem)."""
    fd = os.dup(root_fd)
    mnt = mount_id(root_fd)
    try:
        for part in relpath.split("/") if relpath else ():
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "unexpected path component", relpath)
            child = open_dir_at(fd, part, expect_dev, mnt)
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


def walk(
    root_fd: int,
    *,
    dev: int,
    descend: Callable[[Entry], bool] | None = None,
    prune_paths: frozenset[str] = frozenset(),
    post_order: bool = False,
    on_problem: Callable[[WalkProblem], None] | None = None,
    hook: Hook | None = None,
    mnt: int | None = None,
) -> Iterator[Entry]:
    """Yield every entry below root_fd (depth first), directories before their contents.

    descend(entry) decides whether a directory is entered (default: yes).
    prune_paths are relative paths never yielded nor entered (mount points below
    the root). Entries on another device than `dev` are skipped and reported.
    With post_order, each entered directory is yielded again with post=True after
    its contents. The caller must not keep dir_fd past the next iteration.
    Given mnt (mount_id of root_fd), a directory on another mount is never entered,
    even one missing from prune_paths (mounted after they were read).
    """
    # Stack of (fd, iterator, relative prefix, the entry for this dir or None for the root).
    stack: list[tuple[int, Iterator[os.DirEntry[str]], str, Entry | None]] = []

    problem = _reporter(on_problem)
    try:
        first = os.dup(root_fd)
        try:
            stack.append((first, os.scandir(first), "", None))
        except OSError as exc:
            os.close(first)
            problem(".", exc)
            return
        while stack:
            fd, it, prefix, here = stack[-1]
            try:
                dirent = next(it, None)
            except OSError as exc:  # getdents failed (e.g. directory removed under us)
                problem(prefix.rstrip("/") or ".", exc)
                dirent = None
            if dirent is None:
                stack.pop()
                _close(fd, it)
                if post_order and here is not None:
                    # The parent's fd is the new top of the stack; rmdir relative to it is safe.
                    yield here._replace(dir_fd=stack[-1][0], post=True)
                continue
            entry = _listed_entry(fd, prefix, dirent, dev, prune_paths, problem)
            if entry is None:
                continue
            yield entry
            if not entry.is_dir or (descend is not None and not descend(entry)):
                continue
            opened = _enter(entry, dev, mnt, hook, problem)
            if opened is not None:
                stack.append((*opened, entry.path + "/", entry))
    finally:
        for fd, it, _prefix, _here in reversed(stack):
            _close(fd, it)


def _reporter(on_problem: Callable[[WalkProblem], None] | None) -> Callable[[str, OSError], None]:
    """Where the walk reports an entry it skips: the caller's callback, else one warning line."""

    def problem(path: str, exc: OSError) -> None:
        reason = classify_error(exc)
        if on_problem is not None:
            on_problem(WalkProblem(path, reason, exc.strerror or str(exc)))
        else:
            log.warning("cleanup walk: skipping %s (%s: %s)", path, reason, exc.strerror or exc)

    return problem


def _listed_entry(fd: int, prefix: str, dirent: os.DirEntry[str], dev: int, prune_paths: frozenset[str],
                  problem: Callable[[str, OSError], None]) -> Entry | None:
    """The entry for one listed name (its lstat), or None when it is pruned, gone, or on another filesystem."""
    path = prefix + dirent.name
    if path in prune_paths:
        return None
    try:
        st = dirent.stat(follow_symlinks=False)
    except OSError as exc:
        problem(path, exc)
        return None
    if st.st_dev != dev:
        problem(path, OSError(errno.EXDEV, "on another filesystem"))
        return None
    return Entry(fd, dirent.name, path, st, stat.S_ISDIR(st.st_mode))


def _enter(entry: Entry, dev: int, mnt: int | None, hook: Hook | None,
           problem: Callable[[str, OSError], None]) -> tuple[int, Iterator[os.DirEntry[str]]] | None:
    """Open a directory the walk descends into (fd and listing), or report why not and give None."""
    if hook is not None:
        hook("open_dir", entry.path)
    try:
        child, _cst, child_it = open_subdir(entry.dir_fd, entry.name, entry.st.st_ino, dev, mnt)
    except OSError as exc:
        problem(entry.path, exc)
        return None
    return child, child_it


def open_subdir(parent_fd: int, name: str, listed_ino: int, dev: int,
                mnt: int | None = None) -> tuple[int, os.stat_result, Iterator[os.DirEntry[str]]]:
    """Open a listed subdirectory relative to its parent's fd, never through a symlink, and only if it
    is still the directory that was listed (inode listed_ino) and on the root's filesystem. Raises
    OSError otherwise."""
    child = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        cst = os.fstat(child)
        if cst.st_dev != dev:
            raise OSError(errno.EXDEV, "directory is on another filesystem")
        if cst.st_ino != listed_ino:
            # Replaced between listing and opening: the entry we judged is gone.
            raise OSError(errno.ENOENT, "directory was replaced during the scan")
        check_same_mount(child, mnt, name)
        return child, cst, os.scandir(child)
    except OSError:
        os.close(child)
        raise


def _close(fd: int, it: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    os.close(fd)


class Listing:
    """One directory being read by scan(). The caller iterates `entries` itself (see scan)."""

    __slots__ = ("fd", "path", "prefix", "st", "entries", "pos", "enter", "marks", "order", "pending")

    def __init__(self, fd: int, path: str, st: os.stat_result, entries: Iterator[os.DirEntry[str]]):
        self.fd = fd
        self.path = path  # relative to the scan root, "" for the root itself
        self.prefix = path + "/" if path else ""
        self.st = st  # fstat of the opened directory, taken before it was listed
        self.entries = entries  # the scandir iterator, resumed where the caller left it
        self.pos = 0  # entries the caller has consumed so far (its position in the listing)
        self.enter: tuple[str, int] | None = None  # set by the caller: descend into (name, inode listed)
        self.marks: bytearray | None = None  # caller's per-entry bitmap (see cleanup's age plan)
        self.order = 0  # caller's fingerprint of the listing order so far (see listing_order)
        self.pending: list[tuple[str, int]] | None = None  # a batch reader's subdirectories still to enter


# Fingerprint of a directory listing's order, d_ino by d_ino (free from getdents): two
# readings of a directory give the same value when they list the same inodes in the
# same order, i.e. the n-th entry of one is the n-th entry of the other.
ORDER_MASK = (1 << 64) - 1
ORDER_MUL = 1000003


def listing_order(order: int, ino: int) -> int:
    """Fold one more entry into a listing-order fingerprint (inlined in hot loops)."""
    return (order * ORDER_MUL ^ ino) & ORDER_MASK


def scan(root_fd: int, *, dev: int, on_problem: Callable[[WalkProblem], None], hook: Hook | None = None,
         mnt: int | None = None) -> Iterator[Listing]:
    """Depth-first walk handing out whole listings, so the caller's per-entry loop is its own.

    walk() costs a generator step and an Entry per entry; for a million-file tree the
    caller's loop over `listing.entries` is the hot path instead. Protocol: for each
    yielded listing, consume entries (counting them in listing.pos); to descend into a
    subdirectory set listing.enter = (name, inode) and break out; to finish the
    directory, consume it to the end. scan() then yields the child's listing (opened
    O_NOFOLLOW relative to the parent, same filesystem and inode as judged), and later
    the parent again, positioned after the child. Memory is one fd and one iterator
    per level of depth. Opening problems go to on_problem; the caller reports errors
    raised while it reads entries.
    """
    first = os.dup(root_fd)
    try:
        root = Listing(first, "", os.fstat(first), os.scandir(first))
    except OSError as exc:
        os.close(first)
        on_problem(WalkProblem(".", classify_error(exc), exc.strerror or str(exc)))
        return
    stack = [root]
    try:
        while stack:
            here = stack[-1]
            yield here
            enter, here.enter = here.enter, None
            if enter is None:  # the caller read the listing to its end
                stack.pop()
                _close(here.fd, here.entries)
                continue
            name, ino = enter
            path = here.prefix + name
            if hook is not None:
                hook("open_dir", path)
            try:
                child, cst, child_it = open_subdir(here.fd, name, ino, dev, mnt)
            except OSError as exc:
                on_problem(WalkProblem(path, classify_error(exc), exc.strerror or str(exc)))
                continue
            stack.append(Listing(child, path, cst, child_it))
    finally:
        for here in reversed(stack):
            _close(here.fd, here.entries)


class DirChain:
    """Reopens directories below a root by relative path, keeping the ancestors open for the next one.

    Paths given in depth-first post-order (children before their parent) reuse the
    open prefix, so each directory is opened once. Every component is opened
    O_NOFOLLOW|O_DIRECTORY relative to its parent and must be on the root's filesystem.
    The fstat taken when a directory was opened is kept: for a parent, that is before
    its children were cleaned.
    """

    def __init__(self, root_fd: int, dev: int, hook: Hook | None = None):
        self.dev = dev
        self.hook = hook
        fd = os.dup(root_fd)
        self.mnt = mount_id(root_fd)
        self._names: list[str] = []
        self._open: list[tuple[int, os.stat_result]] = [(fd, os.fstat(fd))]

    def open(self, relpath: str) -> tuple[int, os.stat_result]:
        parts = relpath.split("/") if relpath else []
        keep = 0
        while keep < len(parts) and keep < len(self._names) and self._names[keep] == parts[keep]:
            keep += 1
        self._truncate(keep)
        for part in parts[keep:]:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "unexpected path component", relpath)
            if self.hook is not None:
                self.hook("open_dir", "/".join(self._names + [part]))
            fd = open_dir_at(self._open[-1][0], part, self.dev, self.mnt)
            self._names.append(part)
            self._open.append((fd, os.fstat(fd)))
        return self._open[-1]

    @property
    def parent_fd(self) -> int:
        """The fd of the parent of the directory last opened."""
        return self._open[-2][0]

    def forget_last(self) -> None:
        """Close the directory last opened (it was removed)."""
        self._truncate(len(self._names) - 1)

    def close(self) -> None:
        self._truncate(0)
        os.close(self._open[0][0])

    def _truncate(self, depth: int) -> None:
        while len(self._names) > depth:
            self._names.pop()
            os.close(self._open.pop()[0])
