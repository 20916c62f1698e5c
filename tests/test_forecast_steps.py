"""Checkpoint staircases in the pure fill trend: steps seen through noise, and the ETA's stated error."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from trainguard import config as configmod
from trainguard.detectors import forecast
from trainguard.detectors import staircase as staircase_module
from trainguard.detectors.fit import regime
from trainguard.detectors.sawtooth import LOW_ERRORS
from trainguard.detectors.steps import steps
from trainguard.detectors.trend import fill_trend

from tests.support.plain_fit import plain_eta

GB = 1e9
H = 3600.0
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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_earliest_eta_counts_on_the_scatter_of_three_intervals_at_least(seed):
    """Two intervals give the writes' scatter one degree of freedom: the earliest ETA is not built on it
    (it is the central one, and the error stated widens the margin instead). From three on, the scatter
    brings the earliest ETA forward."""
    three = fill_trend(staircase(3, every=5400.0, scatter=0.3, seed=seed), SIZE, 3 * 5400.0, 6 * 3600.0, 1800.0)
    four = fill_trend(staircase(4, every=4000.0, scatter=0.3, seed=seed), SIZE, 4 * 4000.0, 6 * 3600.0, 1800.0)
    assert three.eta_error > 0 and three.eta_early == three.eta
    assert four.eta_error > 0 and four.eta_early < four.eta


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


def scattered_until_full(seed: int, every: float, nbytes: float, free: float = 400 * GB,
                         background: float = 0.0) -> tuple[list[tuple[float, float]], float]:
    """10 s samples of checkpoints whose sizes and intervals scatter by +-50 % (saves at evaluations,
    epochs of uneven length), each written over 60 s, until full; and when it is full."""
    rng = random.Random(seed)
    pts, t, left, start = [], 0.0, 0.0, every * rng.uniform(0.5, 1.5)
    size = nbytes * rng.uniform(0.5, 1.5)
    while free > 0:
        pts.append((t, free))
        if start <= t < start + 60:
            free -= size / 6
            left = start + 60
        elif t >= left and left:
            start, size, left = start + every * rng.uniform(0.5, 1.5), nbytes * rng.uniform(0.5, 1.5), 0.0
        free -= background * 10
        t += 10.0
    return pts, t


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("every", [20 * 60.0, 75 * 60.0])
def test_writes_scattered_by_half_their_size_and_period_are_warned_6_h_ahead(seed, every):
    """Writes scattered by +-50 % in size and time: from 6 h before full the disk may be full an hour or
    more either side of the mean's ETA. The warning comes 6 h ahead at least, held to the end, and no
    later than the plain least-squares line through the window warns (predict_linear's rule)."""
    cfg = configmod.parse({}, "test").forecast
    pts, full = scattered_until_full(seed, every, nbytes=400 * GB * every / (20 * 3600.0))
    first, plain_first = None, None
    for now in range(int(full - 16 * 3600.0), int(full), 300):
        seen = [p for p in pts if now - cfg.window <= p[0] <= now]
        if forecast.level(fill_trend(seen, SIZE, now, cfg.window, cfg.min_span), cfg) is None:
            first = None
        elif first is None:
            first = now
        eta = plain_eta(seen)  # predict_linear(avail[window], warning) < 0
        if eta is None or eta >= cfg.warning:
            plain_first = None
        elif plain_first is None:
            plain_first = now
    assert first is not None and full - first >= cfg.warning, (full - first) / 3600 if first else None
    assert plain_first is None or first <= plain_first


def test_halves_of_a_staircase_a_write_apart_are_one_regime_and_a_stop_is_seen_after_its_longest_gap():
    """Three large writes in the older half of the window and two small ones in the newer: their rates
    are 2x apart, by the luck of where the writes fell, and the rhythm is one regime (the newer half
    alone said "a rate that stopped" and hid the fill for an hour). Writes that stop are seen to: once
    the quiet since the last outlasts twice the longest interval, the rate is the quiet's."""
    pts, free, t = [], 500 * GB, 0.0
    writes = {1800: 20 * GB, 4800: 22 * GB, 8400: 29 * GB, 12600: 15 * GB, 16800: 11 * GB}  # s -> bytes
    while t <= 6 * 3600.0 + 5 * 3600.0:
        free -= writes.get(int(t), 0.0) + 0.01 * GB  # and a little background every 10 s
        pts.append((t, free))
        t += 10.0
    longest = 4200.0

    def regime_at(now: float) -> tuple[float, float]:
        return regime([p for p in pts if now - 6 * 3600.0 <= p[0] <= now], SIZE, 1800.0)

    rate, evidence = regime_at(6 * 3600.0)
    assert evidence > 5.9 * 3600.0 and rate * 3600 > 10 * GB  # the window's rhythm, not the background
    rate, evidence = regime_at(16800.0 + 2 * longest - 600)
    assert rate * 3600 > 10 * GB
    rate, evidence = regime_at(16800.0 + 2 * longest + 600)
    assert rate * 3600 == pytest.approx(3.6 * GB, rel=0.1) and evidence == pytest.approx(2 * longest + 600, abs=60)


def test_the_earliest_eta_of_bursts_is_not_before_the_last_write_that_fits():
    """Bursts of logs, four seen in the window (+-50 % in size and time) on a disk their pace fills in 11 h
    (58 GB free, 5.7 GB every 1.25 h on 0.65 GB/h): the margin for the mean learned from four grows by a
    step each write, and the disk at its bound is just under zero before the seventh while the sixth still
    fit. Full after the sixth, 7.5 h on, not 4.6 h: that deficit was read as the background's, 4 h of it."""
    spread, nbytes = 0.326, 5.70 * GB
    k, eta = staircase_module._first_short(
        57.68 * GB, 1.25 * H, 1.25 * H, 0.651 * GB / H, nbytes, 120.0, nbytes,
        lambda k: LOW_ERRORS * nbytes * spread * math.sqrt((k + 1) + (k + 1) ** 2 / 4))
    assert k == 6 and 1.25 * H + 5 * 1.25 * H + 120.0 <= eta < 1.25 * H + 6 * 1.25 * H


@settings(max_examples=300, deadline=None, derandomize=True)
@given(avail=st.floats(1 * GB, 500 * GB), first_in=st.floats(0.0, 3 * H), every=st.floats(600.0, 3 * H),
       background=st.floats(0.0, 2 * GB / H), nbytes=st.floats(0.5 * GB, 30 * GB), share=st.floats(0.0, 0.8),
       steps_of_margin=st.lists(st.floats(0.0, 20 * GB), min_size=1, max_size=8))
def test_the_write_that_does_not_fit_comes_after_every_write_that_does(avail, first_in, every, background, nbytes,
                                                                          share, steps_of_margin):
    """Whatever the margin (growing by steps, as the error of a mean times the writes to come): the disk is full
    no earlier than the end of the last write whose free space before it, at that margin, held the room for
    it, and by the write that found less. Checked against the free space before each write worked out here."""
    write = share * every

    def margin(k: int) -> float:
        return sum(steps_of_margin[:k + 1]) + steps_of_margin[-1] * max(k + 1 - len(steps_of_margin), 0)

    found = staircase_module._first_short(avail, first_in, every, background, nbytes, write, nbytes, margin)
    assume(found is not None)
    k, eta = found
    before = [avail - background * (first_in + j * every) - j * nbytes - margin(j) for j in range(k + 1)]
    assert all(free >= nbytes for free in before[:k]) and before[k] < nbytes
    ulp = 1e-9 * (first_in + k * every)  # the times are summed a period at a time
    if k > 0:
        assert eta >= first_in + (k - 1) * every + write - ulp
    assert eta <= first_in + k * every + write + ulp
