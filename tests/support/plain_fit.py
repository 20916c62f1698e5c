"""The plain reference the forecast tests compare with: predict_linear's least-squares line, written here
and not taken from the daemon."""

from __future__ import annotations


def plain_eta(points) -> float | None:
    """Seconds to full by the least-squares line through the points, taken at the newest one (as
    predict_linear takes it at the evaluation time); None when it does not fall."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if n < 2 or var <= 0:
        return None
    slope = sum((t - mt) * (v - mv) for t, v in points) / var
    at_now = mv + slope * (points[-1][0] - mt)
    return at_now / -slope if slope < 0 else None
