"""Isolated outliers taken out of a free-space series before it is fitted.

A sample far off both its neighbours (a statfs answer taken in a moment of churn, a misread) is not a
deletion followed by a write of the same size: counted as one, two of them make a "cleanup rhythm" out
of nothing, and one in sight during warm-up looks like a churn. A Hampel filter replaces a sample that
lies more than OUTLIER robust widths (1.4826 MAD) off the median of its neighbourhood by that median,
both taken along the neighbourhood's own slope (a fast fill moves the samples of a neighbourhood apart
more than their noise does). Steps (a cleanup, a checkpoint) and ramps (a write over several samples)
have their median on their own side and are kept; one or two samples off together are outliers, three
in a row are not.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.detectors.fit import theil_sen

HALF = 3  # neighbours each side: seven samples, of which up to two may be off
OUTLIER = 5.0


def despiked(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out = list(points)
    for i, (ts, value) in enumerate(points):
        near = points[max(i - HALF, 0):i + HALF + 1]
        # Theil-Sen: two outliers among the seven leave most pairs' slopes alone.
        slope = theil_sen(near) or 0.0
        along = sorted(v - slope * (t - ts) for t, v in near)
        mid = along[len(along) // 2]
        spread = sorted(abs(v - mid) for v in along)[len(along) // 2]
        if abs(value - mid) > OUTLIER * 1.4826 * spread + 1.0:
            out[i] = (ts, mid)
    return out
