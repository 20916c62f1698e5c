"""Processes whose open files this run cannot see, and the files they could have open.

Without root (or CAP_SYS_PTRACE), /proc/PID/fd of another user's process is unreadable, so
the open-file index (inuse.OpenFiles) cannot tell whether that process holds a candidate.
What everyone can read of it is /proc/PID/status and /proc/PID/stat: its user and group ids,
its capabilities, whether it is a kernel thread or a zombie (neither holds files). From those
and a candidate's lstat, HoldBack says whether such a process could have the file open:

- it runs (or can switch) as the file's owner: the owner can always open it (or chmod it);
- one of its groups is the file's group and the group bits allow reading or writing;
- the "other" bits allow reading or writing;
- it has a capability that bypasses file permissions (root's processes, usually).

For a directory deleted whole (a checkpoint directory, a cache unit) the execute bit counts
too: a process that can reach the files inside may have one open. Symlinks are never open.
A file that could be open is kept (reason "unverifiable-open") and the run says how many
processes it could not inspect, so that running as root can be chosen knowingly.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Sequence

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread has no open files
# CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER: any of them opens (or chmods) any file.
_OVERRIDE_CAPS = (1 << 1) | (1 << 2) | (1 << 3)
_RW_OTHER, _RW_GROUP = 0o006, 0o060
_RWX_OTHER, _RWX_GROUP = 0o007, 0o070


@dataclass(frozen=True, slots=True)
class Uninspected:
    """A process whose fds cannot be read, and what it may open."""

    pid: int
    uids: frozenset[int]  # real, effective, saved and filesystem uid: it may switch between them
    gids: frozenset[int]  # the same for groups, plus its supplementary groups
    overrides: bool  # a capability that bypasses file permissions


def read_uninspected(proc_root: str, pid: str) -> Uninspected | None:
    """What /proc says about a process whose fds are unreadable; None for one that cannot hold
    files (a kernel thread, a zombie) or is gone."""
    base = os.path.join(proc_root, pid)
    try:
        with open(os.path.join(base, "stat"), "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        if fields[0] in (b"Z", b"X") or int(fields[6]) & PF_KTHREAD:
            return None
        with open(os.path.join(base, "status"), "rb") as fh:
            status = dict(line.split(b":", 1) for line in fh if b":" in line)
    except (OSError, IndexError, ValueError):
        return None
    try:
        uids = frozenset(int(x) for x in status[b"Uid"].split())
        gids = frozenset(int(x) for x in status[b"Gid"].split() + status.get(b"Groups", b"").split())
        caps = int(status.get(b"CapEff", b"0"), 16) | int(status.get(b"CapPrm", b"0"), 16)
    except (KeyError, ValueError):  # an unexpected /proc: assume the worst of it
        return Uninspected(int(pid), frozenset(), frozenset(), True)
    return Uninspected(int(pid), uids, gids, bool(caps & _OVERRIDE_CAPS))


class HoldBack:
    """Whether an entry could be open in one of the uninspected processes, tested on its lstat."""

    __slots__ = ("procs", "everything", "uids", "gids")

    def __init__(self, procs: Sequence[Uninspected] = ()):
        self.procs = tuple(procs)
        self.everything = any(p.overrides for p in self.procs)
        self.uids = frozenset().union(*(p.uids for p in self.procs))
        self.gids = frozenset().union(*(p.gids for p in self.procs))

    def __call__(self, st: os.stat_result) -> bool:
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return False  # a symlink itself is never open; deleting it closes nothing
        if self.everything or st.st_uid in self.uids:
            return True
        other, group = (_RWX_OTHER, _RWX_GROUP) if stat.S_ISDIR(mode) else (_RW_OTHER, _RW_GROUP)
        # "other" bits are conservative: a process in the file's group is refused by them in POSIX.
        return bool(mode & other) or bool(mode & group and st.st_gid in self.gids)
