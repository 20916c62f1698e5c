"""Filesystem usage via statvfs, probed so that a hung mount never hangs the daemon.

statvfs on a dead NFS or FUSE mount blocks in the kernel, possibly forever. Probes run
in threads kept between cycles (sources.prober): one for all healthy local mounts in turn,
one of its own for each network or FUSE mount and for a local mount that was found slow;
the cycle waits a short, bounded time for the answers. A probe that has not returned is never started again (no thread
pile-up): the mount keeps its last usage, and once the probe is older than
`timeout` the mount is reported unresponsive with how long. It recovers when the
probe finally returns.

On network and FUSE mounts the statfs itself runs in a short-lived child process
(coreutils `stat -f`), and the probe thread only waits for its output. Once a
FUSE request has reached its (hung) server, the kernel makes the calling thread
wait it out even through SIGKILL, and a process cannot finish exiting while one
of its threads waits: a `trainguard status` or a daemon stopping would hang with
the mount. A stuck child is left behind instead, and ends when the kernel lets it.
Local filesystems answer statfs from memory and are probed in a thread.

Probe children are tracked by PID. close() (every command calls it on its way out)
SIGKILLs and reaps the ones still running, so no command leaves a child behind on a
hung mount: an NFS wait and a FUSE request its server has not taken yet (a stopped or
saturated server) end on SIGKILL. A FUSE request the server has already taken cannot
be interrupted by anyone; such a child is named in the log with the way to end it
(the server answering or dying, or aborting the connection in /sys/fs/fuse/connections).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, Sequence

from trainguard.clock import Clock
from trainguard.records import FsSample, FsUsage, Mount, MountKind
from trainguard.sources import mounts as mountinfo
from trainguard.sources.prober import Batch, MountProbe, ProbeFn, ProbeResult, Round

log = logging.getLogger(__name__)


def usage_from_counts(frsize: int, blocks: int, bfree: int, bavail: int, files: int, ffree: int,
                      fsid: int = 0) -> FsUsage:
    """Bytes and inodes the way df computes them: used = total - free; avail is the non-root view;
    free inodes are f_ffree, as df -i counts them (statvfs and `stat -f` both give it)."""
    return FsUsage(size_bytes=blocks * frsize, used_bytes=(blocks - bfree) * frsize, avail_bytes=bavail * frsize,
                   inodes_total=files, inodes_used=files - ffree, inodes_free=ffree, fsid=fsid)


def usage_from_statvfs(st: os.statvfs_result) -> FsUsage:
    return usage_from_counts(st.f_frsize or st.f_bsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree,
                             st.f_fsid or 0)  # None in a statvfs_result built from its ten fields


def fsid_of_stat(text: str) -> int:
    """`stat -f -c %i` prints f_fsid's two words the other way round from Python's f_fsid: swap them, so
    both probes name one filesystem alike."""
    value = int(text, 16)
    return (value & 0xFFFFFFFF) << 32 | value >> 32


def _os_error(exc: OSError) -> str:
    return f"{exc.strerror or exc} (errno {exc.errno})"


def _as_is(path: str) -> str:
    return path


def thread_probe(statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 reach: Callable[[str], str] = _as_is) -> ProbeFn:
    """statvfs and the configured paths' existence, in the calling (probe) thread.
    reach maps a host path to the path to open here (a sidecar's host_root prefix)."""

    def probe(mount: Mount, paths: Sequence[str]) -> ProbeResult:
        try:
            usage = usage_from_statvfs(statvfs(reach(mount.mount_point)))
        except OSError as exc:
            return ProbeResult(None, _os_error(exc), ())
        return ProbeResult(usage, None, tuple(p for p in paths if _missing(reach(p))))

    return probe


def _missing(path: str) -> bool:
    """The path does not exist. One we may not look at (a non-root run) is not called missing."""
    try:
        os.lstat(path)
    except PermissionError:
        return False
    except OSError:
        return True
    return False


# frsize, blocks, bfree, bavail, files, ffree, then the name as given (may contain spaces).
STAT_FORMAT = "%S %b %f %a %c %d %i %n"
_ERRNO_OF_MESSAGE = {os.strerror(code): code for code in errno.errorcode}


class Children:
    """The probe children still running, by PID, so that a command can end them on its way out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[subprocess.Popen, Mount]] = {}

    def run(self, argv: Sequence[str], mount: Mount) -> tuple[bytes, bytes, int]:
        """argv's (stdout, stderr, exit status), the child tracked while it runs."""
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                close_fds=True)
        with self._lock:
            self._running[proc.pid] = (proc, mount)
        try:
            out, err = proc.communicate()
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
        return out, err, proc.returncode

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def end_all(self, wait: float = 1.0) -> list[tuple[int, Mount]]:
        """SIGKILL every running child and reap it; returns (pid, mount) of those that the kernel keeps
        (a FUSE request its server has taken and not answered)."""
        with self._lock:
            running = list(self._running.values())
        for proc, _ in running:
            try:
                proc.send_signal(signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        stuck = []
        for proc, mount in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stuck.append((proc.pid, mount))
        return stuck


def child_probe(stat: str, reach: Callable[[str], str] = _as_is, children: Children | None = None) -> ProbeFn:
    """statfs of the mount point and of each path in a `stat -f` child: if the mount hangs, the child
    hangs, and this process stays free to exit. A path is missing when stat could not reach it."""
    children = children if children is not None else Children()

    def probe(mount: Mount, paths: Sequence[str]) -> ProbeResult:
        here = reach(mount.mount_point)
        try:
            stdout, stderr, returncode = children.run(
                [stat, "-f", "-c", STAT_FORMAT, "--", here, *(reach(p) for p in paths)], mount)
        except OSError as exc:
            return ProbeResult(None, f"cannot run {stat}: {_os_error(exc)}", ())
        answered: dict[str, FsUsage] = {}
        for line in stdout.decode("utf-8", "surrogateescape").splitlines():
            fields = line.split(" ", 7)
            try:
                frsize, blocks, bfree, bavail, files, ffree = (int(x) for x in fields[:6])
                fsid = fsid_of_stat(fields[6])
            except (ValueError, IndexError):
                continue
            answered[fields[7] if len(fields) > 7 else ""] = usage_from_counts(frsize, blocks, bfree, bavail,
                                                                               files, ffree, fsid)
        usage = answered.get(here)
        if usage is None:
            # "stat: cannot read file system information for '/x': Transport endpoint is not connected"
            message = stderr.decode("utf-8", "replace").strip().splitlines()
            reason = message[0].rsplit(": ", 1)[-1] if message else f"stat exited {returncode}"
            code = _ERRNO_OF_MESSAGE.get(reason)
            return ProbeResult(None, f"{reason} (errno {code})" if code else reason, ())
        return ProbeResult(usage, None, tuple(p for p in paths if reach(p) not in answered))

    return probe


def _remote(mount: Mount) -> bool:
    return mount.kind is not MountKind.LOCAL or mount.fstype.startswith("fuse")  # fuseblk is FUSE too


class FsSampler:
    """Samples every watched mount; mounts are re-discovered each cycle (they come and go)."""

    def __init__(self, *, clock: Clock, proc_root: str = "/proc", paths: Sequence[str] = (),
                 exclude: Sequence[str] = (), include_fstypes: Sequence[str] = (), timeout: float = 5.0,
                 wait: float = 1.0, statvfs: Callable[[str], os.statvfs_result] | None = None,
                 read_mounts: Callable[[str], Sequence[Mount]] | None = None, host_root: str = "/"):
        """statvfs: inject one for tests (then every mount is probed with it in a thread); by default
        local mounts use os.statvfs and network/FUSE mounts a `stat -f` child."""
        self.clock = clock
        self.proc_root = proc_root
        self.host_root = host_root
        self.paths = tuple(os.path.normpath(os.path.abspath(p)) for p in paths)
        self.exclude = tuple(exclude)
        self.include_fstypes = tuple(include_fstypes)
        self.timeout = timeout
        self.wait = min(wait, timeout)  # the most one cycle waits for slow probes
        self._table = mountinfo.MountTable() if read_mounts is None else None
        self.read_mounts = read_mounts or self._table
        self._local_probe = thread_probe(statvfs or os.statvfs, self._reach)
        self._remote_probe = self._local_probe
        self.children = Children()
        if statvfs is None:
            stat = shutil.which("stat")
            if stat:
                self._remote_probe = child_probe(stat, self._reach, self.children)
            else:
                log.warning("no `stat` command (coreutils or busybox): a hung network or FUSE mount "
                            "can keep trainguard from exiting until it recovers")
        self._probes: dict[str, MountProbe] = {}
        self._finished = threading.Condition()
        self._batch = Batch(self._now)  # healthy local mounts, probed in turn by one thread
        self._own: set[str] = set()  # local mounts the batch was found stuck on: each has its own thread
        self._told: set[str] = set()  # mounts we may not read, already said in the log
        self._selected: tuple | None = None  # (mount table, watched, path -> mount point) of the last change

    def _reach(self, path: str) -> str:
        return mountinfo.host_path(self.host_root, path)

    def _selection(self) -> tuple[list[Mount], dict[str, str | None]]:
        """(the watched mounts, the mount point each configured path lives on), chosen again only when
        the mount table changed: matching every path against every mount each cycle was a fifth of it."""
        all_mounts = tuple(self.read_mounts(self.proc_root))
        if self._selected is None or self._selected[0] != all_mounts:
            watched = mountinfo.select(all_mounts, exclude=self.exclude, include_fstypes=self.include_fstypes,
                                       paths=self.paths)
            owners = {}
            for path in self.paths:
                owner = mountinfo.containing_mount(path, watched)
                owners[path] = owner.mount_point if owner is not None else None
            self._selected = (all_mounts, watched, owners)
        return list(self._selected[1]), self._selected[2]

    def sample(self) -> tuple[list[FsSample], list[str]]:
        """(one FsSample per watched mount, configured paths that do not exist)."""
        watched, owners = self._selection()
        mono, wall = self.clock.monotonic(), self.clock.time()
        current: dict[str, MountProbe] = {}
        for mount in watched:
            probe = self._probes.get(mount.mount_point)
            if probe is None or probe.mount != mount:
                if probe is not None and probe.busy:
                    probe.mount = mount  # remounted while stuck: keep the stuck thread, take the new identity
                else:
                    probe = MountProbe(mount, self._remote_probe if _remote(mount) else self._local_probe)
            current[mount.mount_point] = probe
        # Vanished mounts are forgotten; a stuck thread of theirs ends whenever the kernel lets it.
        self._probes = current
        self._own &= set(current)
        paths_of: dict[str, list[str]] = {mp: [] for mp in current}
        for path in self.paths:  # each path is checked by the probe of the mount it lives on
            owner = owners[path]
            if owner is not None and owner in paths_of:
                paths_of[owner].append(path)
        self._ask(current, paths_of, mono, wall)
        # Stamped after the wait: a one-off command that waited `timeout` for a hung mount must say it has
        # been stuck that long, not 0 s.
        now_mono, now_wall = self.clock.monotonic(), self.clock.time()
        samples: list[FsSample] = []
        missing: list[str] = []
        for probe in current.values():
            samples.append(self._sample_of(probe, now_mono, now_wall))
            if samples[-1].permission_denied and probe.mount.mount_point not in self._told:
                self._told.add(probe.mount.mount_point)
                log.info("cannot read the usage of %s as uid %d (%s): it is not watched and not alerted; run "
                         "trainguard as root to watch it, or add it to filesystems.exclude to silence this line",
                         probe.mount.mount_point, os.geteuid(), samples[-1].error)
            if probe.last is not None and not probe.busy:
                missing.extend(probe.last.missing)
        return samples, missing

    def _ask(self, current: dict[str, MountProbe], paths_of: dict[str, list[str]], mono: float,
             wall: float) -> None:
        """Ask this cycle's probes (the batch for healthy local mounts, its own thread for any other) and
        wait for their answers, at most `wait`. Only the probes asked now are waited for: one still stuck
        from an earlier cycle would make every cycle last `wait` longer while its mount hangs."""
        if self._batch.running:  # stuck since the last cycle: that mount gets its own thread from now on
            stuck = self._batch.abandon()
            if stuck is not None:
                self._own.add(stuck.mount.mount_point)
                log.info("statfs of %s has not returned for %.1f s: it is probed on its own from now on",
                         stuck.mount.mount_point, self.clock.monotonic() - stuck.started_mono)
            self._batch = Batch(self._now)
        # (A local mount the last batch had not reached yet when it got stuck is asked again here.)
        batched = [(p, paths_of[mp]) for mp, p in current.items() if mp not in self._own and not _remote(p.mount)]
        alone = [mp for mp, p in current.items() if mp in self._own or _remote(p.mount)]
        round_ = Round(self._finished, len(batched) + len(alone))
        if batched:
            self._batch.kick(batched, mono, wall, round_)
        fresh = sum(current[mp].kick(mono, wall, paths_of[mp], round_) for mp in alone)
        deadline = mono + self.wait
        with self._finished:
            round_.left -= len(alone) - fresh  # those still stuck from before were not asked
            while round_.left > 0:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    break
                self._finished.wait(left)

    def _now(self) -> tuple[float, float]:
        return self.clock.monotonic(), self.clock.time()

    def _sample_of(self, probe: MountProbe, now_mono: float, wall: float) -> FsSample:
        stuck_for = now_mono - probe.started_mono if probe.busy else 0.0
        last = probe.last
        if probe.busy and stuck_for >= self.timeout:
            return FsSample(probe.mount, wall, last.usage if last else None, responsive=False,
                            unresponsive_since=probe.started_wall)
        if last is None:
            # First probe still running but not yet past the timeout: nothing known yet.
            return FsSample(probe.mount, wall, None)
        return FsSample(probe.mount, wall, last.usage, error=last.error)

    def close(self) -> None:
        """End the probe children still running (a hung mount's): nothing is left behind when we exit."""
        if self._table is not None:
            self._table.close()
        for pid, mount in self.children.end_all():
            if mount.fstype.startswith("fuse"):
                how = ("its FUSE server took the request and has not answered, so not even SIGKILL ends it; it "
                       "exits when the server answers or stops, or when the connection is aborted (echo 1 > "
                       f"/sys/fs/fuse/connections/{mount.minor}/abort; the mount then fails until remounted)")
            else:
                how = "it exits when the server answers or the mount is unmounted (umount -f -l)"
            log.warning("statfs probe (PID %d) on %s is stuck in the kernel: %s", pid, mount.mount_point, how)
