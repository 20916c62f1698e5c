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
