"""Time-to-full forecast accuracy on synthetic training-host traces.

    PYTHONPATH=daemon python bench/forecast_accuracy.py [--runs 40]

Three traces that do fill (a steady writer; a checkpoint of 20 GiB every 30 min; a 40 GiB/h
writer with a cron cleanup freeing 60 GiB every 2 h), each at many phases, evaluated at the
moment the disk is really 6 h (and 1 h) from full, with the default 6 h window. Then traces
that never fill, evaluated every ~10 minutes, counting forecast alerts (ETA < 6 h): a trainer
keeping only its last 3 checkpoints, a fast writer rotated away hourly on a nearly full disk,
one large download after which the disk stops filling, and an idle full disk with noise.

Reference, in the same run: an ordinary least-squares line through the same window, the
first thing one would write. Figures: median and worst absolute ETA error in %, and false
alerts.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "daemon"))

from trainguard.detectors.forecast import fill_trend  # noqa: E402

from tests.support import traces  # noqa: E402

H = 3600.0
GiB = 2**30
WINDOW = 6 * H
MIN_SPAN = 1800.0


def least_squares_eta(pts: list[tuple[float, float]]) -> float | None:
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (v - mv) for t, v in pts) / var if var else 0.0
    return pts[-1][1] / -slope if slope < 0 else None


def trainguard_eta(pts, size, now) -> float | None:
    trend = fill_trend(pts, size, now, WINDOW, MIN_SPAN)
    return trend.eta if trend else None


def errors(make, ttf: float, runs: int, method) -> list[float]:
    out = []
    for k in range(runs):
        # Vary the phase: how far into a step or a cleanup period the disk is when it fills.
        process = make(start_free=(600 + 40 * k / runs + 0.37) * GiB)
        now = process.moment_with_time_to_full(ttf)
        real = process.time_to_full(now)
        pts = process.sample(now - WINDOW, now, seed=k)
        eta = method(pts, process.size, now)
        out.append(math.inf if eta is None else abs(eta - real) / real * 100)
    return out


def false_alerts(process, method, evaluations: int) -> int:
    count = 0
    for k in range(evaluations):
        now = 7 * H + 613 * k
        eta = method(process.sample(now - WINDOW, now, seed=k), process.size, now)
        count += eta is not None and eta < 6 * H
    return count


def fmt(errs: list[float]) -> str:
    worst = max(errs)
    return f"median {statistics.median(errs):6.1f} %  worst {'never' if math.isinf(worst) else f'{worst:6.1f} %'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    methods = {"trainguard": trainguard_eta, "least squares": lambda pts, size, now: least_squares_eta(pts)}
    filling = {"steady 30 GiB/h": traces.steady, "checkpoint 20 GiB / 30 min": traces.checkpoints,
               "40 GiB/h, cleanup 60 GiB / 2 h": traces.fill_with_cleanup}
    print(f"ETA error, window 6 h, {args.runs} phases per trace (absolute error of the forecast ETA)")
    for ttf_h in (6, 1):
        print(f" real time to full {ttf_h} h:")
        for name, make in filling.items():
            for method, fn in methods.items():
                print(f"  {name:32s} {method:14s} {fmt(errors(make, ttf_h * H, args.runs, fn))}")
    never = {"keep last 3 checkpoints": traces.keep_last_checkpoints(),
             "20 GiB/h rotated hourly, 30 GiB": traces.rotated_logs(),
             "one 100 GiB download, then idle": traces.one_download(),
             "idle full disk, noisy": traces.Process("idle", lambda t: 20 * GiB, noise=0.5 * GiB)}
    evaluations = 100
    print(f"false forecast alerts (ETA < 6 h) on traces that never fill, {evaluations} evaluations each")
    for name, process in never.items():
        for method, fn in methods.items():
            print(f"  {name:32s} {method:14s} {false_alerts(process, fn, evaluations):3d} / {evaluations}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
