"""Synthetic free-space traces of a training host's disk, for forecast tests and the accuracy benchmark.

Each trace is a process ``avail(t)`` (bytes free t seconds after the start) with the shapes the field
reports describe: a steady writer (logs, a dataset being extracted), a trainer that saves a checkpoint
every N minutes (a staircase), a filler with a periodic cleanup (a saw-tooth that still trends down), and
a run that keeps only its last checkpoints and so never fills. ``time_to_full`` runs the process forward
to find when it really reaches zero, which is what a forecast is judged against.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

GiB = 2**30
SIZE = 1000 * GiB


@dataclass(frozen=True)
class Process:
    name: str
    avail: Callable[[float], float]  # bytes free at t seconds (noise-free)
    size: int = SIZE
    noise: float = 0.0  # +- bytes of measurement jitter (other processes' small writes)

    def sample(self, start: float, end: float, interval: float = 10.0, seed: int = 1) -> list[tuple[float, float]]:
        """(t, avail) every `interval` seconds in [start, end], with jitter, clamped to the disk."""
        rng = random.Random(seed)
        n = int(round((end - start) / interval))
        out = []
        for i in range(n + 1):
            t = start + i * interval
            value = self.avail(t) + (rng.uniform(-self.noise, self.noise) if self.noise else 0.0)
            out.append((t, min(max(value, 0.0), float(self.size))))
        return out

    def time_to_full(self, after: float = 0.0, step: float = 10.0, limit: float = 30 * 86400) -> float:
        """Seconds from `after` until avail first reaches 0; inf when it does not within `limit`."""
        t = after
        while t <= after + limit:
            if self.avail(t) <= 0:
                return t - after
            t += step
        return math.inf

    def moment_with_time_to_full(self, ttf: float, step: float = 10.0) -> float:
        """The time t at which the real time to full is `ttf`."""
        full_at = self.time_to_full(0.0, step)
        if math.isinf(full_at):
            raise ValueError(f"{self.name} never fills")
        return full_at - ttf


def steady(rate_per_h: float = 30 * GiB, start_free: float = 600 * GiB, noise: float = 0.2 * GiB) -> Process:
    """A constant writer."""
    return Process("steady", lambda t: start_free - rate_per_h * t / 3600, noise=noise)


def checkpoints(every_s: float = 1800, size: float = 20 * GiB, write_s: float = 120,
                start_free: float = 600 * GiB, noise: float = 0.2 * GiB) -> Process:
    """A checkpoint of `size` bytes every `every_s` seconds, each written over `write_s` seconds."""

    def avail(t: float) -> float:
        done, into = divmod(t, every_s)
        return start_free - size * (done + min(into / write_s, 1.0))

    return Process("checkpoint steps", avail, noise=noise)


def fill_with_cleanup(rate_per_h: float = 40 * GiB, every_s: float = 2 * 3600, frees: float = 60 * GiB,
                      start_free: float = 600 * GiB, noise: float = 0.2 * GiB) -> Process:
    """A steady writer and a cron job that frees `frees` bytes every `every_s`: net rate rate - frees/every."""

    def avail(t: float) -> float:
        return start_free - rate_per_h * t / 3600 + frees * math.floor(t / every_s)

    return Process("fill with periodic cleanup", avail, noise=noise)


def keep_last_checkpoints(every_s: float = 1800, size: float = 20 * GiB, keep: int = 3,
                          start_free: float = 300 * GiB, noise: float = 0.3 * GiB) -> Process:
    """A trainer that saves a checkpoint every `every_s` and deletes the oldest beyond `keep`: never fills."""
    write_s, delete_after_s = 120.0, 180.0

    def avail(t: float) -> float:
        done, into = divmod(t, every_s)
        written = size * (done + min(into / write_s, 1.0))
        deleted = size * max(0.0, done + (1.0 if into >= delete_after_s else 0.0) - keep)
        return start_free - written + deleted

    return Process("keep last checkpoints", avail, noise=noise)


def rotated_logs(rate_per_h: float = 20 * GiB, every_s: float = 3600, start_free: float = 30 * GiB,
                 noise: float = 0.2 * GiB) -> Process:
    """A fast writer whose output is rotated away every hour: low free space, but it never fills."""

    def avail(t: float) -> float:
        return start_free - rate_per_h * (t % every_s) / 3600

    return Process("rotated logs", avail, noise=noise)


def one_download(size: float = 100 * GiB, at_s: float = 4 * 3600, takes_s: float = 600,
                 start_free: float = 250 * GiB, noise: float = 0.2 * GiB) -> Process:
    """A dataset downloaded once (100 GiB in 10 minutes), then nothing: the disk stops filling."""

    def avail(t: float) -> float:
        return start_free - size * min(max((t - at_s) / takes_s, 0.0), 1.0)

    return Process("one download", avail, noise=noise)


def slow_leak(rate_per_h: float = 2 * GiB, start_free: float = 60 * GiB, noise: float = 0.1 * GiB) -> Process:
    """A slow leak (a forgotten log, a core-dump loop): a few GiB per hour on a disk with little room."""
    return Process("slow leak", lambda t: start_free - rate_per_h * t / 3600, noise=noise)


def from_events(name: str, start_free: float, events: list[tuple[float, float, float]], size: int = SIZE,
                noise: float = 0.2 * GiB) -> Process:
    """A process from sorted (start, duration, bytes) events: bytes > 0 written, < 0 freed, each spread
    linearly over its duration. Looked up by bisection, so long traces stay cheap to sample."""
    import bisect

    chunked: list[tuple[float, float, float]] = []
    for start, duration, nbytes in events:  # long ramps in 300 s pieces: few events overlap any moment
        pieces = max(1, int(duration // 300))
        chunked.extend((start + k * duration / pieces, duration / pieces, nbytes / pieces) for k in range(pieces))
    events = sorted(chunked)
    starts = [e[0] for e in events]
    done = [0.0]
    for _, _, nbytes in events:
        done.append(done[-1] + nbytes)

    def avail(t: float) -> float:
        k = bisect.bisect_right(starts, t)
        written = done[max(k - 6, 0)]
        for start, duration, nbytes in events[max(k - 6, 0):k]:
            written += nbytes * (min((t - start) / duration, 1.0) if duration > 0 else 1.0)
        return start_free - written

    return Process(name, avail, size=size, noise=noise)


def gc_churn(low: float, high: float, seed: int = 1, size: int = 200 * GiB, ckpt: float = 4 * GiB,
             every_s: float = 1200, hours: float = 480) -> Process:
    """Checkpoints (size and interval +-15 %) until used > high, then a keep-last GC deletes the oldest
    down to used <= low: a saw-tooth between low and high that never fills."""
    rng = random.Random(seed)
    used, t, events, kept = low * size, rng.uniform(0, every_s), [], []
    while t < hours * 3600:
        nbytes = ckpt * rng.uniform(0.85, 1.15)
        events.append((t, 90.0, nbytes))
        used += nbytes
        kept.append(nbytes)
        if used > high * size:
            freed = 0.0
            while used - freed > low * size and len(kept) > 1:
                freed += kept.pop(0)
            events.append((t + 120.0, 30.0, -freed))
            used -= freed
        t += every_s * rng.uniform(0.85, 1.15)
    return from_events(f"GC churn {low:.0%}-{high:.0%}", size * (1 - low), events, size=size, noise=0.05 * GiB)


def download_then_flat(seed: int = 1, start_free: float = 180 * GiB, size: int = 500 * GiB) -> Process:
    """A 35-55 GB model or dataset download at 10-15 MB/s after a few idle hours, then a flat disk."""
    rng = random.Random(seed)
    nbytes, rate = rng.uniform(35e9, 55e9), rng.uniform(10e6, 15e6)
    at = 3 * 3600 + rng.uniform(0, 3600)
    events = [(at, nbytes / rate, nbytes), (at + nbytes / rate, 30 * 86400, 0.02 * GiB * 30 * 24)]
    return from_events("download then flat", start_free, events, size=size, noise=0.1 * GiB)


def bursty_logs(seed: int = 1, start_free: float = 90 * GiB, hours: float = 480) -> Process:
    """Logs at 0.3 GiB/h with 2-4 GiB bursts (an eval dump) every 1-2 h, rotated away every day at 00:00."""
    rng = random.Random(seed)
    events, since_rotation, t = [], 0.0, 0.0
    for day in range(int(hours // 24) + 1):
        t = day * 86400.0
        if day:
            events.append((t, 60.0, -since_rotation))
            since_rotation = 0.0
        events.append((t + 60, 86400 - 120, 0.3 * GiB * 24))
        since_rotation += 0.3 * GiB * 24
        burst_at = t + rng.uniform(1800, 3600)
        while burst_at < t + 86400 - 600:
            nbytes = rng.uniform(2, 4) * GiB
            events.append((burst_at, 300.0, nbytes))
            since_rotation += nbytes
            burst_at += rng.uniform(3600, 7200)
    events.sort()
    return from_events("bursty logs, daily rotation", start_free, events, noise=0.1 * GiB)


def warm_up(seed: int = 1, start_free: float = 60 * GiB, size: int = 500 * GiB) -> Process:
    """A run starting on a 88 %-full disk while the daemon starts too: pip/cache installs (3-8 GiB in
    a few minutes), a dataset extracted (10-15 GiB over 30-40 min), then logs at 0.2 GiB/h. Never fills."""
    rng = random.Random(seed)
    installs, dataset = rng.uniform(3, 8) * GiB, rng.uniform(10, 15) * GiB
    at = rng.uniform(300, 1200)
    extract = rng.uniform(1800, 2400)
    events = [(at, 240.0, installs), (at + 600, extract, dataset),
              (at + 600 + extract, 30 * 86400, 0.2 * GiB * 30 * 24)]
    return from_events("warm-up", start_free, events, size=size, noise=0.3 * GiB)
