"""Does the dest's mount answer? The daemon's own statfs probe, asked once, before a round starts a copier.

`trainguard mirror` has no daemon verdict to go by: it probes the mount holding the dest with the same
killable probe the daemon runs every cycle (sources/fs.py; a `stat -f` child on network and FUSE
mounts), waits at most `probe_timeout`, and leaves nothing behind on its way out. A round on a share
that hangs then ends within seconds, instead of a copier sitting in the kernel for `meta_timeout`.
"""

from __future__ import annotations

import os
from typing import Sequence

from trainguard.clock import Clock, SystemClock
from trainguard.records import FsSample, Mount
from trainguard.sources import mounts as mountinfo
from trainguard.sources import procs
from trainguard.sources.fs import STAT_FORMAT, FsSampler
from trainguard.units import format_duration


def unresponsive(samples: Sequence[FsSample], dest: str, now: float) -> str:
    """Why the dest is known to hang from these mount samples; "" when it is not (or its mount is not among them)."""
    mount = mountinfo.containing_mount(dest, [s.mount for s in samples])
    sample = next((s for s in samples if s.mount is mount), None)
    if sample is None or sample.responsive:
        return ""
    since = f" for {format_duration(now - sample.unresponsive_since)}" if sample.unresponsive_since else ""
    return f"dest unresponsive: {mount.mount_point} ({mount.fstype}) does not answer statfs{since}"


def earlier_probe(mount: Mount, timeout: float, proc_root: str = "/proc") -> tuple[int, float] | None:
    """(PID, seconds waited) of a statfs probe child of this mount that has waited longer than `timeout` and
    still does: an earlier command's, which the kernel keeps in the share's request (SIGKILL cannot end it)."""
    try:
        with open(os.path.join(proc_root, "uptime")) as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in procs.list_pids(proc_root):
        argv = procs.read_cmdline(proc_root, pid)
        if argv[1:6] != ("-f", "-c", STAT_FORMAT, "--", mount.mount_point):
            continue
        seen = procs.read_start(proc_root, pid)
        if seen is not None and seen[0] not in ("Z", "X") and uptime - seen[1] / ticks >= timeout:
            return pid, uptime - seen[1] / ticks
    return None


def probe_dest(dest: str, timeout: float, *, clock: Clock | None = None, proc_root: str = "/proc") -> str:
    """Probe the mount holding dest once, waiting at most `timeout`: "" when it answers, else the reason.
    While an earlier probe of that mount still waits in the kernel, no second one is started: commands
    run again and again on a share that hangs would otherwise leave one stuck child each."""
    clock = clock or SystemClock()

    def dest_mount(root: str) -> list[Mount]:
        found = mountinfo.containing_mount(dest, mountinfo.read_mounts(root, own=True))  # where the copier opens it
        return [found] if found is not None else []

    mounts = dest_mount(proc_root)
    stuck = earlier_probe(mounts[0], timeout, proc_root) if mounts else None
    if stuck is not None:
        return (f"dest unresponsive: {mounts[0].mount_point} ({mounts[0].fstype}) does not answer statfs for "
                f"{format_duration(stuck[1])} (an earlier probe, pid {stuck[0]}, still waits)")

    sampler = FsSampler(clock=clock, proc_root=proc_root, paths=[dest], timeout=timeout, wait=timeout,
                        read_mounts=dest_mount)
    try:
        samples, _ = sampler.sample()
        return unresponsive(samples, dest, clock.time())
    finally:
        sampler.close()  # a probe child the kernel keeps is named in the log, and never waited for
