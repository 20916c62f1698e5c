"""Time-to-full forecast accuracy and false alarms on synthetic training-host traces, against Prometheus.

    PYTHONPATH=daemon python bench/forecast_accuracy.py [--seeds 5] [--hours 48]

Each trace is simulated with 10 s samples and evaluated every 5 minutes, as a running daemon and a
Prometheus rule would be. Three methods side by side:
- trainguard: the daemon's own history, trend and alert decision (store.history, detectors.follow.follow_trend,
  forecast.level; default [forecast] config: 6 h window, warning when the ETA is under 6 h);
- predict_linear: the rule `predict_linear(avail[6h], 6*3600) < 0`, with Prometheus' exact semantics
  (ordinary least squares over the samples of the range (t-6h, t], intercept at the evaluation time);
- predict_linear for 1h: the same rule with `for: 1h` (pending until it has held for an hour);
- and trainguard's fs.next_checkpoint finding: its lead before full, and its episodes where nothing fills.

Filling traces (steady fill, checkpoint steps, slow leak, a saw-tooth that still fills) run from the
daemon's start to the moment the disk is full: *lead* is how long before full the alert that was
firing at the end started (the minimum over seeds), *ETA error* the absolute error of the forecast
ETA at the evaluations 5.5-6.5 h before full (median and worst over seeds), *episodes* the alert
episodes raised (1 is right). Traces that never fill (GC churn at 60-72 % and 85-97 %, a download
then a flat disk, bursty logs rotated daily, a trainer keeping its last checkpoints, hourly rotation,
an idle full disk) are evaluated after one window of history, for --hours; the warm-up trace from the
first sample. For those, every alert episode is a false alarm.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import random
import statistics
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "daemon"))

from trainguard.config import Forecast  # noqa: E402
from trainguard.detectors.checkpoint import judge  # noqa: E402
from trainguard.detectors.forecast import level  # noqa: E402
from trainguard.detectors.follow import follow_trend  # noqa: E402
from trainguard.store.history import History  # noqa: E402

from tests.support import traces  # noqa: E402

H = 3600.0
GiB = 2**30
CFG = Forecast()
WINDOW = CFG.window
EVERY = 300.0  # evaluation interval, seconds
FOR_1H = 3600.0


def linear_regression(pts, intercept_time: float) -> tuple[float, float] | None:
    """Prometheus' linearRegression (promql/functions.go): slope and intercept at intercept_time, Kahan sums."""
    if len(pts) < 2:
        return None
    sums = [[0.0, 0.0] for _ in range(4)]  # x, y, xy, x2 with their compensation terms

    def add(k: int, inc: float) -> None:
        total, c = sums[k]
        t = total + inc
        c += (total - t) + inc if abs(total) >= abs(inc) else (inc - t) + total
        sums[k] = [t, c]

    const = all(v == pts[0][1] for _, v in pts)
    if const:
        return 0.0, pts[0][1]
    n = float(len(pts))
    for ts, v in pts:
        x = ts - intercept_time
        add(0, x), add(1, v), add(2, x * v), add(3, x * x)
    sx, sy, sxy, sx2 = (total + c for total, c in sums)
    cov, var = sxy - sx * sy / n, sx2 - sx * sx / n
    slope = cov / var
    return slope, sy / n - slope * sx / n


class Series:
    def __init__(self, pts):
        self.pts = pts
        self.ts = [t for t, _ in pts]

    def window(self, now: float, left_open: bool):
        lo = (bisect.bisect_right if left_open else bisect.bisect_left)(self.ts, now - WINDOW)
        return self.pts[lo:bisect.bisect_right(self.ts, now)]


def run_trainguard(series: Series, size: float, times, next_checkpoint: list | None = None):
    """The forecast alert per evaluation, from the daemon's own History (full resolution for 15 min,
    60 s means before); `next_checkpoint` collects whether fs.next_checkpoint is found."""
    out, active, fit = [], None, None
    history, fed = History(None, window=WINDOW), 0
    for now in times:
        while fed < len(series.pts) and series.pts[fed][0] <= now:
            history.record(series.pts[fed][0], {"avail": series.pts[fed][1]})
            fed += 1
        pts = history.points("avail", now - WINDOW)
        trend, fit = follow_trend(fit, lambda since: history.points("avail", since), size, now, CFG)
        alert = level(trend, CFG, active)
        active = alert[0] if alert else None
        out.append((alert is not None, trend.eta if trend else None))
        if next_checkpoint is not None:
            next_checkpoint.append(bool(pts) and judge(trend, pts, pts[-1][1], size, (), CFG, now) is not None)
    return out


def run_promql(series: Series, times, hold: float):
    out, since = [], None
    for now in times:
        fit = linear_regression(series.window(now, True), now)
        cond = fit is not None and fit[0] * WINDOW + fit[1] < 0
        since = (since if since is not None else now) if cond else None
        eta = -fit[1] / fit[0] if fit and fit[0] < 0 else None
        out.append((cond and now - since >= hold, eta))
    return out


def episodes(run) -> int:
    return sum(1 for k, (on, _) in enumerate(run) if on and (k == 0 or not run[k - 1][0]))


def lead(run, times, full_at: float) -> float:
    if not run or not run[-1][0]:
        return 0.0
    k = len(run) - 1
    while k > 0 and run[k - 1][0]:
        k -= 1
    return full_at - times[k]


NEXT_CHECKPOINT: list = []  # fs.next_checkpoint found, per trainguard evaluation of the current trace

METHODS = {
    "trainguard": lambda s, size, times: run_trainguard(s, size, times, NEXT_CHECKPOINT),
    "predict_linear": lambda s, size, times: run_promql(s, times, 0.0),
    "predict_linear for 1h": lambda s, size, times: run_promql(s, times, FOR_1H),
}


def filling(seed: int) -> dict:
    rng = random.Random(seed)
    return {
        "steady fill": traces.steady(rng.uniform(20, 40) * GiB, rng.uniform(500, 700) * GiB),
        "checkpoint steps": traces.checkpoints(rng.uniform(1200, 2400), rng.uniform(10, 30) * GiB,
                                               start_free=rng.uniform(500, 700) * GiB),
        "slow leak": traces.slow_leak(rng.uniform(1, 3) * GiB, rng.uniform(40, 80) * GiB),
        "saw-tooth that fills": traces.fill_with_cleanup(start_free=(600 + 7.3 * seed) * GiB),
    }


def never_filling(seed: int, hours: float) -> dict:
    return {
        "GC churn 60-72 %": (traces.gc_churn(0.60, 0.72, seed), WINDOW),
        "GC churn 85-97 %": (traces.gc_churn(0.85, 0.97, seed), WINDOW),
        "download then flat": (traces.download_then_flat(seed), WINDOW),
        "bursty logs, daily rotation": (traces.bursty_logs(seed), WINDOW),
        "keep last 3 checkpoints": (traces.keep_last_checkpoints(noise=(0.2 + 0.05 * seed) * GiB), WINDOW),
        "20 GiB/h rotated hourly": (traces.rotated_logs(), WINDOW),
        "idle full disk, noisy": (traces.Process("idle", lambda t: 20 * GiB, noise=0.5 * GiB), WINDOW),
        "warm-up": (traces.warm_up(seed), 0.0),
    }


def bench_filling(seeds: int) -> dict:
    rows: dict = {}
    for seed in range(1, seeds + 1):
        for name, process in filling(seed).items():
            full_at = process.time_to_full(0.0, step=60.0)
            series = Series(process.sample(0.0, full_at, seed=seed))
            # Every 5 min, and every 10 s (the daemon's cycle) around the moment an alert is due, so the
            # lead is not rounded down by the evaluation interval.
            fine = (full_at - 6.3 * H, full_at - 5.7 * H)
            times = sorted({EVERY * k for k in range(1, int(full_at // EVERY) + 1)}
                           | {fine[0] + 10.0 * k for k in range(int((fine[1] - fine[0]) // 10))})
            for method, fn in METHODS.items():
                NEXT_CHECKPOINT.clear()
                run = fn(series, process.size, times)
                row = rows.setdefault((name, method), {"lead": [], "err": [], "episodes": [], "ckpt": []})
                if NEXT_CHECKPOINT:
                    row["ckpt"].append(lead([(on, None) for on in NEXT_CHECKPOINT], times, full_at))
                row["lead"].append(lead(run, times, full_at))
                row["episodes"].append(episodes(run))
                for k, t in enumerate(times):
                    if 5.5 * H <= full_at - t <= 6.5 * H and t % EVERY == 0:
                        eta = run[k][1]
                        row["err"].append(math.inf if eta is None else abs(eta - (full_at - t)) / (full_at - t) * 100)
    return rows


def bench_never(seeds: int, hours: float) -> dict:
    rows: dict = {}
    for seed in range(1, seeds + 1):
        for name, (process, start) in never_filling(seed, hours).items():
            end = start + hours * H if start else 12 * H
            series = Series(process.sample(0.0, end, seed=seed))
            times = [start + EVERY * k for k in range(1, int((end - start) // EVERY) + 1)]
            for method, fn in METHODS.items():
                NEXT_CHECKPOINT.clear()
                count = episodes(fn(series, process.size, times))
                rows.setdefault((name, method), []).append(count)
                if NEXT_CHECKPOINT:
                    rows.setdefault((name, "trainguard fs.next_checkpoint"), []).append(
                        episodes([(on, None) for on in NEXT_CHECKPOINT]))
    return rows


def hm(seconds: float) -> str:
    return f"{int(seconds // H)} h {int(seconds % H // 60):02d} min"


def pct(errs) -> str:
    worst = max(errs)
    return f"{statistics.median(errs):5.1f} % / {'never' if math.isinf(worst) else f'{worst:5.1f} %'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--hours", type=float, default=48.0, help="evaluated hours per never-filling trace")
    args = ap.parse_args()
    started = time.monotonic()
    print(f"{args.seeds} seeds; 10 s samples, evaluated every {EVERY / 60:.0f} min; warning at ETA < 6 h\n")
    print("| filling trace | method | min lead | ETA error at ~6 h (median / worst) | alert episodes |")
    print("| --- | --- | --- | --- | --- |")
    for (name, method), row in bench_filling(args.seeds).items():
        print(f"| {name} | {method} | {hm(min(row['lead']))} | {pct(row['err'])} | "
              f"{' '.join(map(str, row['episodes']))} |")
        if any(row["ckpt"]):
            print(f"| {name} | trainguard fs.next_checkpoint | {hm(min(row['ckpt']))} | | |")
    print(f"\n| never-filling trace ({args.hours:.0f} h each; warm-up 12 h) | method | false alert episodes per seed |")
    print("| --- | --- | --- |")
    for (name, method), counts in bench_never(args.seeds, args.hours).items():
        print(f"| {name} | {method} | {' '.join(map(str, counts))} (total {sum(counts)}) |")
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
