"""/proc/diskstats: every kernel's line format parses, and rates come from deltas on the monotonic clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainguard.sources.diskstats import (
    SECTOR,
    Counters,
    DiskstatsSampler,
    parse_diskstats,
    rates,
)

from tests.support.clock import FakeClock

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("fixture, fields", [
    ("diskstats_5_15.txt", 20), ("diskstats_4_19.txt", 18), ("diskstats_3_10.txt", 14),
])
def test_full_formats_of_each_kernel_generation(fixture, fields):
    text = (DATA / fixture).read_text()
    assert {len(line.split()) for line in text.splitlines()} == {fields}
    stats = parse_diskstats(text)
    assert len(stats) == len(text.splitlines())
    for line in text.splitlines():
        f = line.split()
        c = stats[f[2]]
        assert (c.major, c.minor, c.reads, c.sectors_read, c.ms_reading) == (int(f[0]), int(f[1]), int(f[3]),
                                                                             int(f[5]), int(f[6]))
        assert (c.writes, c.sectors_written, c.ms_writing, c.ms_doing_io) == (int(f[7]), int(f[9]), int(f[10]),
                                                                              int(f[12]))


def test_kernel_5_15_devices_partitions_md_and_dm():
    stats = parse_diskstats((DATA / "diskstats_5_15.txt").read_text())
    assert (stats["nvme0n1p2"].major, stats["nvme0n1p2"].minor) == (259, 2)
    assert (stats["md0"].major, stats["md0"].minor, stats["md0"].sectors_written) == (9, 0, 2401211904)
    assert (stats["dm-0"].major, stats["dm-0"].minor) == (253, 0)


def test_old_kernel_short_partition_lines():
    # Before 2.6.25 a partition line had 4 counters: reads, sectors read, writes, sectors written.
    stats = parse_diskstats((DATA / "diskstats_2_6_18.txt").read_text())
    sda1 = stats["sda1"]
    assert (sda1.reads, sda1.sectors_read, sda1.writes, sda1.sectors_written) == (95, 190, 48, 6)
    assert sda1.ms_doing_io is None, "no busy time on short lines: utilisation is unknown, not 0"
    assert stats["sda"].ms_doing_io == 9120


def test_malformed_lines_are_skipped():
    text = "garbage\n 8 0 sda x y z 1 2 3 4 5 6 7 8\n 8 1 sda1 1 2\n" + (DATA / "diskstats_3_10.txt").read_text()
    assert set(parse_diskstats(text)) == {"sda", "sda1"}


def counters(name="sda", *, reads=0, sr=0, msr=0, writes=0, sw=0, msw=0, busy: int | None = 0, dev=(8, 0)):
    return Counters(dev[0], dev[1], name, reads, sr, msr, writes, sw, msw, busy)


def test_rates_over_an_interval():
    prev = counters(reads=100, sr=1000, msr=50, writes=200, sw=4000, msw=350, busy=1000)
    cur = counters(reads=150, sr=3048, msr=100, writes=250, sw=24480, msw=500, busy=10000)
    io = rates(prev, cur, 10.0)
    assert io.util_ratio == pytest.approx(0.9)  # 9000 ms busy in 10 s
    assert io.read_bytes_per_s == pytest.approx(2048 * SECTOR / 10)
    assert io.write_bytes_per_s == pytest.approx(20480 * SECTOR / 10)
    assert io.await_ms == pytest.approx((50 + 150) / 100)


def test_util_is_capped_and_idle_has_no_await():
    io = rates(counters(busy=0), counters(busy=12_000), 10.0)
    assert io.util_ratio == 1.0, "io_ticks can run a little ahead of the wall clock"
    assert io.await_ms is None


@pytest.mark.parametrize("field", ["reads", "sr", "msr", "writes", "sw", "msw", "busy"])
def test_a_counter_that_goes_backwards_gives_no_rate(field):
    # A 32-bit counter that wraps, a device whose stats were reset or that was replaced: one interval
    # is skipped rather than reported as a huge or negative rate.
    prev = counters(reads=10, sr=10, msr=10, writes=10, sw=10, msw=10, busy=2**32 - 5)
    cur = counters(reads=20, sr=20, msr=20, writes=20, sw=20, msw=20, busy=2**32 + 100)
    cur = Counters(**{**{s: getattr(cur, s) for s in Counters.__slots__},
                      {"sr": "sectors_read", "msr": "ms_reading", "sw": "sectors_written", "msw": "ms_writing",
                       "busy": "ms_doing_io"}.get(field, field): 3})
    assert rates(prev, cur, 10.0) is None


def test_no_rate_over_an_empty_interval():
    assert rates(counters(), counters(reads=5), 0.0) is None


def write_stats(root: Path, lines: list[str]) -> None:
    (root / "diskstats").write_text("".join(line + "\n" for line in lines))


def line(name, dev, reads, sr, writes, sw, busy, ms=0):
    return f"{dev[0]:4d} {dev[1]:7d} {name} {reads} 0 {sr} {ms} {writes} 0 {sw} {ms} 0 {busy} {ms} 0 0 0 0 0 0"


def test_sampler_needs_two_readings_and_uses_the_monotonic_clock(tmp_path):
    clock = FakeClock()
    sampler = DiskstatsSampler(clock=clock, proc_root=str(tmp_path))
    write_stats(tmp_path, [line("vda", (254, 0), 0, 0, 0, 0, 0)])
    assert sampler.sample() == []
    clock.advance(10)
    clock.jump(-3600)  # an NTP step back must not turn 10 s into -3590 s
    write_stats(tmp_path, [line("vda", (254, 0), 10, 2048, 20, 4096, 5000)])
    (io,) = sampler.sample()
    assert io.name == "vda" and io.util_ratio == pytest.approx(0.5)
    assert io.write_bytes_per_s == pytest.approx(4096 * SECTOR / 10)
    clock.advance(10)
    clock.jump(+86400)  # nor a jump forward into a tiny rate
    write_stats(tmp_path, [line("vda", (254, 0), 10, 2048, 20, 8192, 14000)])
    (io,) = sampler.sample()
    assert io.util_ratio == pytest.approx(0.9)


def test_sampler_survives_reset_replaced_and_new_devices(tmp_path):
    clock = FakeClock()
    sampler = DiskstatsSampler(clock=clock, proc_root=str(tmp_path))
    write_stats(tmp_path, [line("sda", (8, 0), 100, 100, 100, 100, 100), line("loop0", (7, 0), 5, 5, 5, 5, 5)])
    sampler.sample()
    clock.advance(10)
    # sda's counters were reset; loop0 now names another device; nvme0n1 appeared.
    write_stats(tmp_path, [line("sda", (8, 0), 1, 1, 1, 1, 1), line("loop0", (7, 9), 50, 50, 50, 50, 50),
                           line("nvme0n1", (259, 0), 1, 1, 1, 1, 1)])
    assert sampler.sample() == []
    clock.advance(10)
    write_stats(tmp_path, [line("sda", (8, 0), 2, 21, 2, 21, 2001), line("loop0", (7, 9), 50, 50, 50, 50, 50),
                           line("nvme0n1", (259, 0), 1, 1, 1, 1, 1)])
    got = {d.name: d for d in sampler.sample()}
    assert set(got) == {"sda", "loop0", "nvme0n1"}, "each recovers on the next interval"
    assert got["sda"].util_ratio == pytest.approx(0.2)


def test_sampler_without_diskstats_reports_nothing(tmp_path):
    sampler = DiskstatsSampler(clock=FakeClock(), proc_root=str(tmp_path / "absent"))
    assert sampler.sample() == [] and sampler.sample() == []


def test_sampler_reads_this_machines_diskstats():
    clock = FakeClock()
    sampler = DiskstatsSampler(clock=clock)
    if not sampler.read():
        pytest.skip("no /proc/diskstats here")
    sampler.sample()
    clock.advance(1)
    assert all(0.0 <= d.util_ratio <= 1.0 for d in sampler.sample())
