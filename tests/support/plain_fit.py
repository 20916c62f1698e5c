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


def plain_warnings(points, times, window: float, horizon: float, evidence_ratio: float) -> list[bool]:
    """Whether the plain fit warns at each of `times` (ascending): the least-squares line through the points
    of the `window` before it, taken at that time, full in under `horizon` and no further ahead than
    `evidence_ratio` times the span its points cover (the evidence rule the daemon keeps too). Prefix
    sums: one pass over the points for all the times."""
    if not points:
        return [False] * len(times)
    sums = [(0.0, 0.0, 0.0, 0.0, 0.0)]  # prefix sums of 1, t, v, t*v, t*t (t, v from the first point)
    t0, v0 = points[0]
    for t, v in points:
        x, y = t - t0, v - v0
        a = sums[-1]
        sums.append((a[0] + 1, a[1] + x, a[2] + y, a[3] + x * y, a[4] + x * x))
    out, lo, hi = [], 0, 0
    for now in times:
        while hi < len(points) and points[hi][0] <= now:
            hi += 1
        while lo < hi and points[lo][0] <= now - window:
            lo += 1
        n, sx, sy, sxy, sxx = (b - a for a, b in zip(sums[lo], sums[hi]))
        var = sxx - sx * sx / n if n >= 2 else 0.0
        warns = False
        if var > 0:
            slope = (sxy - sx * sy / n) / var
            at_now = v0 + sy / n + slope * (now - t0 - sx / n)
            eta = at_now / -slope if slope < 0 else None
            warns = eta is not None and eta < horizon and eta <= evidence_ratio * (points[hi - 1][0] - points[lo][0])
        out.append(warns)
    return out
