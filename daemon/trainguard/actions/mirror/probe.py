"""Does the dest's mount answer? The daemon's own statfs probe, asked once, before a round starts a copier.

`trainguard mirror` has no daemon verdict to go by: it probes the mount holding the dest with the same
killable probe the daemon runs every cycle (sources/fs.py; a `stat -f` child on network and FUSE
mounts), waits at most `probe_timeout`, and leaves nothing behind on its way out. A round on a share
that hangs then ends within seconds, instead of a copier sitting in the kernel for `meta_timeout`.
"""

from __future__ import annotations

from typing import Sequence

from trainguard.clock import Clock, SystemClock
from trainguard.records import FsSample, Mount
from trainguard.sources import mounts as mountinfo
from trainguard.sources.fs import FsSampler
from trainguard.units import format_duration


def unresponsive(samples: Sequence[FsSample], dest: str, now: float) -> str:
    """Why the dest is known to hang from these mount samples; "" when it is not (or its mount is not among them)."""
    mount = mountinfo.containing_mount(dest, [s.mount for s in samples])
    sample = next((s for s in samples if s.mount is mount), None)
    if sample is None or sample.responsive:
        return ""
    since = f" for {format_duration(now - sample.unresponsive_since)}" if sample.unresponsive_since else ""
    return f"dest unresponsive: {mount.mount_point} ({mount.fstype}) does not answer statfs{since}"


def probe_dest(dest: str, timeout: float, *, clock: Clock | None = None, proc_root: str = "/proc") -> str:
    """Probe the mount holding dest once, waiting at most `timeout`: "" when it answers, else the reason."""
    clock = clock or SystemClock()

    def dest_mount(root: str) -> list[Mount]:
        found = mountinfo.containing_mount(dest, mountinfo.read_mounts(root, own=True))  # where the copier opens it
        return [found] if found is not None else []

    sampler = FsSampler(clock=clock, proc_root=proc_root, paths=[dest], timeout=timeout, wait=timeout,
                        read_mounts=dest_mount)
    try:
        samples, _ = sampler.sample()
    finally:
        sampler.close()  # a probe child the kernel keeps is named in the log, and never waited for
    return unresponsive(samples, dest, clock.time())
