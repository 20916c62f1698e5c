"""Per block device I/O rates from /proc/diskstats counter deltas."""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainguard.clock import Clock
from trainguard.records import DiskIo

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size


@dataclass(frozen=True, slots=True)
class Counters:
    major: int
    minor: int
    name: str
    reads: int
    sectors_read: int
    ms_reading: int
    writes: int
    sectors_written: int
    ms_writing: int
    ms_doing_io: int | None  # absent in the short partition format of old kernels


def parse_diskstats(text: str) -> dict[str, Counters]:
    """Accepts every format the kernel has used: 14 fields (2.6+), 18 (4.18+, discards),
    20 (5.5+, flushes), and the 7-field partition lines of kernels before 2.6.25."""
    out: dict[str, Counters] = {}
    for line in text.splitlines():
        f = line.split()
        try:
            if len(f) >= 14:
                c = Counters(int(f[0]), int(f[1]), f[2], int(f[3]), int(f[5]), int(f[6]), int(f[7]), int(f[9]),
                             int(f[10]), int(f[12]))
            elif len(f) == 7:
                c = Counters(int(f[0]), int(f[1]), f[2], int(f[3]), int(f[4]), 0, int(f[5]), int(f[6]), 0, None)
            else:
                continue
        except ValueError:
            continue
        out[c.name] = c
    return out


def rates(prev: Counters, cur: Counters, seconds: float) -> DiskIo | None:
    """Rates over one interval; None when a counter went backwards (wrap, reset, device replaced)."""
    if seconds <= 0:
        return None
    deltas = [cur.reads - prev.reads, cur.writes - prev.writes, cur.sectors_read - prev.sectors_read,
              cur.sectors_written - prev.sectors_written, cur.ms_reading - prev.ms_reading,
              cur.ms_writing - prev.ms_writing]
    busy = None
    if cur.ms_doing_io is not None and prev.ms_doing_io is not None:
        busy = cur.ms_doing_io - prev.ms_doing_io
        deltas.append(busy)
    if any(d < 0 for d in deltas):
        return None
    d_reads, d_writes, d_sr, d_sw, d_msr, d_msw = deltas[:6]
    ios = d_reads + d_writes
    return DiskIo(
        name=cur.name, major=cur.major, minor=cur.minor,
        util_ratio=min(1.0, busy / (seconds * 1000.0)) if busy is not None else 0.0,
        read_bytes_per_s=d_sr * SECTOR / seconds, write_bytes_per_s=d_sw * SECTOR / seconds,
        await_ms=round((d_msr + d_msw) / ios, 2) if ios else None,
    )


class DiskstatsSampler:
    """Rates need two readings: the first sample() returns nothing."""

    def __init__(self, *, clock: Clock, proc_root: str = "/proc"):
        self.clock = clock
        self.path = os.path.join(proc_root, "diskstats")
        self._prev: dict[str, Counters] = {}
        self._prev_mono = 0.0

    def read(self) -> dict[str, Counters]:
        try:
            with open(self.path, encoding="ascii", errors="replace") as fh:
                return parse_diskstats(fh.read())
        except OSError:
            return {}  # no /proc/diskstats (some containers): I/O figures are simply absent

    def sample(self) -> list[DiskIo]:
        mono = self.clock.monotonic()
        current = self.read()
        seconds = mono - self._prev_mono
        out = []
        for name, c in current.items():
            prev = self._prev.get(name)
            if prev is not None and (prev.major, prev.minor) == (c.major, c.minor):
                io = rates(prev, c, seconds)
                if io is not None:
                    out.append(io)
        self._prev, self._prev_mono = current, mono
        return out
