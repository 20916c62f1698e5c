"""A fill whose rate grows steadily is forecast at that growth (detectors.growth), a step or a steady fill
is not. The reference is the disk itself: the true time to full, integrated here from its known rate."""

from __future__ import annotations

import math
import random

import pytest
from trainguard.detectors.growth import grown_eta

GB, H, DAY = 1e9, 3600.0, 86400.0


def samples(rate, hours: float = 6.0, free: float = 500 * GB, noise: float = 0.0, seed: int = 1):
    """10 s samples of free space over `hours`, written at rate(t) bytes/s, and the free bytes at the end."""
    rng, pts, avail = random.Random(seed), [], free
    for k in range(int(hours * H / 10) + 1):
        pts.append((10.0 * k, avail + rng.gauss(0.0, noise)))
        avail -= rate(10.0 * k) * 10.0
    return pts, pts[-1][1]


def true_time_to_full(rate, start: float, free: float) -> float:
    t, left = start, free
    while left > 0:
        left -= rate(t) * 10.0
        t += 10.0
    return t - start


@pytest.mark.parametrize("per_day", [1.5, 2.0, 4.0])
def test_a_fill_growing_steadily_is_forecast_at_its_growth(per_day):
    def rate(t):
        return 10 * GB / H * per_day ** (t / DAY)

    pts, latest = samples(rate, noise=0.05 * GB)
    truth = true_time_to_full(rate, pts[-1][0], latest)
    line = latest / ((pts[0][1] - pts[-1][1]) / (pts[-1][0] - pts[0][0]))  # the window's own line
    assert line > truth * 1.05  # the line is late by the growth it does not see
    assert grown_eta(pts, latest) == pytest.approx(truth, rel=0.05)


def test_a_steady_fill_is_not_growth():
    pts, latest = samples(lambda t: 10 * GB / H * (1 + 0.08 * math.sin(t / 1800)), noise=0.05 * GB)
    assert grown_eta(pts, latest) is None


def test_a_download_that_started_is_a_step_not_growth():
    pts, latest = samples(lambda t: 0.1 * GB / H if t < 3 * H else 40 * GB / H, free=1500 * GB)
    assert grown_eta(pts, latest) is None


def test_minutes_of_a_fill_say_nothing_of_its_growth():
    pts, latest = samples(lambda t: 10 * GB / H * 4 ** (t / DAY), hours=2.0)
    assert grown_eta(pts, latest) is None
