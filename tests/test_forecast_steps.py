"""Checkpoint staircases in the pure fill trend: steps seen through noise, and the ETA's stated error."""

from __future__ import annotations

import random

import pytest
from trainguard import config as configmod
from trainguard.detectors import forecast
from trainguard.detectors.steps import steps
from trainguard.detectors.trend import fill_trend

GB = 1e9
SIZE = 1000 * GB


def staircase(n: int, every: float = 3600.0, nbytes: float = 20 * GB, blip_in_last: bool = False,
              scatter: float = 0.0, seed: int = 1) -> list[tuple[float, float]]:
    """10 s samples; a 100 s write of `nbytes` every `every` seconds, n of them, then 10 min of quiet."""
    rng = random.Random(seed)
    pts, avail, t = [], 500 * GB, 0.0
    starts = [every * (k + 0.5) * (1 + rng.uniform(-scatter, scatter) / (k + 1)) for k in range(n)]
    sizes = [nbytes * (1 + rng.uniform(-scatter, scatter)) for _ in range(n)]
    end = starts[-1] + 700
    while t <= end:
        for k, s in enumerate(starts):
            if s <= t < s + 100:
                avail -= sizes[k] / 10
                if blip_in_last and k == n - 1 and t == s + 50:
                    avail += sizes[k] / 10 + 0.1 * GB  # one sample the other way in the middle of the write
        pts.append((t, avail))
        t += 10.0
    return pts


def test_a_write_cut_in_two_by_one_sample_is_one_step():
    found, _ = steps(staircase(5, blip_in_last=True), SIZE)
    assert len(found) == 5
    # What it fell over its whole length: 20 GB, less the share of the sample that went the other way.
    assert found[-1].nbytes == pytest.approx(17.9 * GB, rel=0.02)


def test_the_eta_error_of_a_few_steps_is_wider_than_of_many():
    """The same scatter of sizes and intervals: four steps learned leave the ETA less certain than
    eleven, by more than the square root of their number alone (Student's t)."""
    few = fill_trend(staircase(4, every=3000.0, scatter=0.08), SIZE, 4 * 3000.0, 6 * 3600.0, 1800.0)
    many = fill_trend(staircase(11, every=1000.0, scatter=0.08), SIZE, 11 * 1000.0, 6 * 3600.0, 1800.0)
    assert few is not None and many is not None and few.eta_error > 0 and many.eta_error > 0
    assert few.eta_error > many.eta_error * (10 / 3) ** 0.5


def test_writes_smaller_than_a_deletion_are_still_a_rhythm():
    """Checkpoints of 0.2 % of the disk, well above the noise: learned as a rhythm (the ETA is that of
    the write that does not fit, and states its error), not as a line through the staircase."""
    pts = staircase(11, every=1000.0, nbytes=2 * GB, scatter=0.05)
    trend = fill_trend(pts, SIZE, 11 * 1000.0, 6 * 3600.0, 1800.0)
    assert trend is not None and trend.eta_error > 0
    assert trend.eta == pytest.approx(pts[-1][1] / trend.slope, rel=0.02)


def larger_later(free: float, learned: float, every: float = 1800.0, nbytes: float = 20 * GB,
                 later: float = 1.06) -> tuple[list[tuple[float, float]], float]:
    """10 s samples of a staircase until full, and when it is full: a 100 s write every `every`, of
    `nbytes` +-10 % until `learned`, then each `later` times the mean (one standard error of a size
    larger, as writes to come may be)."""
    rng = random.Random(3)
    sizes = [nbytes * (1 + rng.uniform(-0.1, 0.1)) if every * (k + 0.5) < learned else nbytes * later
             for k in range(int(free / nbytes) + 50)]
    pts, t = [], 0.0
    while free > 0:
        pts.append((t, free))
        k = int((t - 0.5 * every) // every)
        if k >= 0 and t < every * (k + 0.5) + 100:
            free -= sizes[k] / 10
        t += 10.0
    return pts, t


def test_a_staircase_whose_write_does_not_fit_a_period_early_still_warns_6_h_ahead():
    """Writes a little larger than the learned mean: one fewer fits, and the disk is full a period (30 min)
    before the central ETA says. The warning keeps its lead against the earliest write that may not fit."""
    cfg = configmod.parse({}, "test").forecast
    pts, full = larger_later(530 * GB, learned=6 * 3600.0)
    now = full - 7 * 3600.0
    while now < full - 5 * 3600.0:
        trend = fill_trend([p for p in pts if p[0] <= now], SIZE, now, 6 * 3600.0, 1800.0)
        if forecast.level(trend, cfg) is not None:
            break
        now += 60.0
    assert full - now >= cfg.warning
    assert trend.eta > full - now + 0.5 * 1800.0  # the central ETA is a write too late
    assert trend.eta_early < full - now


def test_a_rhythm_of_writes_just_under_the_deletion_mark_is_not_taken_for_a_rate_that_stopped():
    """Checkpoints of ~0.46 % of the disk, scattered so that one of them passes the 0.5 % mark of a
    deletion-sized write. That one write is not "a download and quiet since", and the flat stretch
    between two writes is not "a rate that stopped": the trend keeps the rhythm's rate at every cycle
    (the fit flipping to a flat tail ended or blocked each warning)."""
    every, nbytes = 1900.0, 4.6 * GB
    pts = staircase(14, every=every, nbytes=nbytes, scatter=0.12, seed=7)
    assert max(s.nbytes for s in steps(pts, SIZE, least=0.0)[0]) > 0.005 * SIZE  # one passes the mark
    for now in range(int(8 * every), int(pts[-1][0]), 60):
        trend = fill_trend([p for p in pts if p[0] <= now], SIZE, now, 6 * 3600.0, 1800.0)
        assert trend is not None and trend.slope == pytest.approx(nbytes / every, rel=0.3), now
