"""Forecast score on many seeded traces per family (bench/trace_families.py), beside predict_linear.

    PYTHONPATH=daemon python bench/forecast_holdout.py --seeds 1:20          # development range
    PYTHONPATH=daemon python bench/forecast_holdout.py --hold-out [--per-family 20]

Seeds below 1000001 are for development. A hold-out range is run once with the final code and then counts
as seen: 1000001-20 to 9000001-20 were, 10000001-3 to 22000001-3 (`--hold-out --per-family 3`),
23000001-12, 24000001-12 and 25000001-12 (the last, in docs/forecast.md); `--hold-out` runs the next range no
code has run on yet (26000001 on).
Each trace is fed, 10 s sample by 10 s sample with the wall-clock stamps the daemon would write
(restarts leave gaps, clock steps move the stamps), through the daemon's History and the daemon's own
fit and alert rule (detectors.forecast.follow_trend and level, default [forecast]), evaluated every
--every seconds; a restart forgets the incremental fit but not the alert state nor the cleanup cycles
learned, which it reads back from the state database's table (all three as the daemon does).

Score:
- never-filling families: false alert episodes per 1,000 h judged (from one window of history on; on a
  disk cleaned every 4-20 h, from its second cleanup; "from a fresh start", from the start, warm-up included);
- filling families: the least lead (first warning of the episode firing at the end, to full), and the
  ETA error at the evaluations 5.5-6.5 h before full (median and worst, per cent);
- cleanups that stop: the share of the time from the missed cleanup to full that a warning is on, and how
  long after the cleanup was due (or 6 h before full, if later) the warning came, in periods of the rhythm
  (a seed fails beyond a quarter period).
predict_linear is the rule `predict_linear(avail[6h], 6*3600) < 0` (Prometheus' least squares over the
range's samples, intercept at the evaluation time) on the same samples.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import os
import sqlite3
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "daemon"), HERE]

import trace_families as tf  # noqa: E402
from forecast_accuracy import episodes, lead  # noqa: E402  (the same scoring as the fixed traces)
from trainguard.config import Forecast  # noqa: E402
from trainguard.detectors.forecast import follow_trend, learned, level, seeded  # noqa: E402
from trainguard.store.cycles import LearnedCycles  # noqa: E402
from trainguard.store.history import History  # noqa: E402

H = 3600.0
CFG = Forecast()
HOLD_OUT = 26_000_001  # 1000001-20 to 9000001-20, 10000001-3 to 22000001-3, 23000001-12 to 25000001-12: seen
NAME = "fs.avail_bytes:/data"


def run_trainguard(trace: tf.Trace, times: list[float]) -> list[tuple[bool, float | None]]:
    """(alerting, eta) at each true evaluation time, through the daemon's History and incremental fit;
    the learned cleanup cycles kept in the state database's table, as the daemon keeps them."""
    out, active, fit = [], None, None
    history = History(None, window=CFG.window)
    store = LearnedCycles(sqlite3.connect(":memory:"))
    samples = trace.samples()
    pending = next(samples, None)
    was_down = False
    for now in times:
        wall = now
        while pending is not None and pending[0] <= now:
            t, wall_t, value = pending
            history.record(wall_t, {NAME: value})
            wall = wall_t
            pending = next(samples, None)
        down = any(a <= now < b for a, b in trace.gaps)
        if down:
            out.append((False, None))  # the daemon is not running: it alerts nothing
            was_down = True
            continue
        last = history.latest(NAME)
        if last is None:
            out.append((False, None))
            continue
        wall = last[0]
        if was_down:  # a restarted daemon starts without its in-memory fit, from the cycles it saved
            fit, was_down = seeded(store.load(wall).get(NAME, ())), False
        trend, fit = follow_trend(fit, lambda since: history.points(NAME, since), trace.size, wall, CFG)
        store.save(NAME, learned(fit), wall)
        alert = level(trend, CFG, active)
        active = alert[0] if alert else None
        out.append((alert is not None, trend.eta if trend else None))
    return out


class Promql:
    """predict_linear over (now - 6 h, now] from prefix sums of the samples (exact least squares)."""

    def __init__(self, trace: tf.Trace):
        pts, last = [], -math.inf
        for _, wall, value in trace.samples():
            if wall > last:  # Prometheus rejects out-of-order samples
                pts.append((wall, value))
                last = wall
        self.ts = [t for t, _ in pts]
        self.t0, self.v0 = pts[0]
        self.sums = [(0.0, 0.0, 0.0, 0.0, 0.0)]
        for t, v in pts:
            x, y = t - self.t0, v - self.v0
            s = self.sums[-1]
            self.sums.append((s[0] + 1, s[1] + x, s[2] + y, s[3] + x * y, s[4] + x * x))

    def eval(self, now: float) -> float | None:
        """ETA in seconds from now, or None (not filling); the rule fires when it is under 6 h."""
        lo = bisect.bisect_right(self.ts, now - CFG.window)
        hi = bisect.bisect_right(self.ts, now)
        n, sx, sy, sxy, sx2 = (b - a for a, b in zip(self.sums[lo], self.sums[hi]))
        if n < 2:
            return None
        var = sx2 - sx * sx / n
        if var <= 0:
            return None
        slope = (sxy - sx * sy / n) / var
        x_now = now - self.t0
        at_now = sy / n + slope * (x_now - sx / n) + self.v0
        return at_now / -slope if slope < 0 else None


def run_promql(trace: tf.Trace, times: list[float]) -> list[tuple[bool, float | None]]:
    prom = Promql(trace)
    out = []
    for now in times:
        eta = prom.eval(now)
        out.append((eta is not None and eta < CFG.warning, eta))
    return out


METHODS = {"trainguard": run_trainguard, "predict_linear": run_promql}


def score_family(family: str, seeds, every: float, verbose: bool) -> dict:
    rows = {m: {"episodes": 0, "hours": 0.0, "lead": [], "err": [], "bad": [], "late": [], "share": []}
            for m in METHODS}
    for seed in seeds:
        trace = tf.draw(family, seed)
        if trace.full_at is not None:
            end = trace.full_at
            times = [every * k for k in range(1, int(end // every) + 1)]
            # every 10 s around the moment a warning is due, so the lead is not rounded to `every`
            times = sorted(set(times) | {end - 6.4 * H + 10.0 * k for k in range(int(0.8 * H / 10))})
        else:
            end = trace.hours * H - tf.STEP
            times = [every * k for k in range(1, int(end // every) + 1)]
        for method, fn in METHODS.items():
            run = fn(trace, times)
            row = rows[method]
            if trace.full_at is None:
                judged = [(on, eta) for (on, eta), t in zip(run, times) if t >= trace.judge_from]
                count = episodes(judged)
                row["episodes"] += count
                row["hours"] += (end - trace.judge_from) / H
                if count:
                    row["bad"].append(seed)
            elif trace.missed_at is not None:
                # A rhythm that stops: from when is it warned, against when the missed cleanup was due (or
                # 6 h before full, if that is later), and for what share of the time from the miss to full.
                due = max(trace.missed_at, trace.full_at - 6 * H)
                late = max(trace.full_at - lead(run, times, trace.full_at) - due, 0.0) / (trace.params["period_h"] * H)
                row["late"].append(late)
                after = [on for (on, _), t in zip(run, times) if t >= trace.missed_at and t % every == 0]
                row["share"].append(sum(after) / max(len(after), 1) * 100)
                if late > 0.25:
                    row["bad"].append(seed)
            else:
                row["lead"].append(lead(run, times, trace.full_at))
                if row["lead"][-1] < 6 * H:
                    row["bad"].append(seed)
                for (on, eta), t in zip(run, times):
                    left = trace.full_at - t
                    if 5.5 * H <= left <= 6.5 * H and t % every == 0:
                        row["err"].append(math.inf if eta is None else abs(eta - left) / left * 100)
        if verbose:
            got = rows["trainguard"]
            what = (f"late by {got['late'][-1]:.2f} periods" if trace.missed_at is not None
                    else hm(got["lead"][-1]) if trace.full_at is not None else f"{got['episodes']} episodes so far")
            print(f"  {family} seed {seed}: {what}; {trace.params}", file=sys.stderr)
    return rows


def hm(seconds: float) -> str:
    return f"{int(seconds // H)} h {int(seconds % H // 60):02d} min"


def pct(errs) -> str:
    if not errs:
        return "-"
    worst = max(errs)
    return f"{statistics.median(errs):.1f} % / {'never' if math.isinf(worst) else f'{worst:.1f} %'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1:20", help="first:last seed (development range)")
    ap.add_argument("--hold-out", action="store_true", help=f"seeds from {HOLD_OUT}, never used in development")
    ap.add_argument("--per-family", type=int, default=20, help="traces per family with --hold-out")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between evaluations (the daemon: 10)")
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    logging.getLogger("trainguard.store.history").setLevel(logging.ERROR)  # clock steps are the point here
    if args.hold_out:
        seeds = range(HOLD_OUT, HOLD_OUT + args.per_family)
    else:
        first, last = (int(x) for x in args.seeds.split(":"))
        seeds = range(first, last + 1)
    started = time.monotonic()
    print(f"seeds {seeds.start}..{seeds.stop - 1} ({len(seeds)} per family), 10 s samples, evaluated every "
          f"{args.every:.0f} s, default [forecast]\n")
    print("| family | trainguard | predict_linear | seeds that failed (trainguard) |")
    print("| --- | --- | --- | --- |")
    for family in args.family or tf.FAMILIES:
        rows = score_family(family, seeds, args.every, args.verbose)
        cells = []
        for method in METHODS:
            row = rows[method]
            if family in tf.NEVER:
                per_1000 = row["episodes"] / row["hours"] * 1000
                cells.append(f"{per_1000:.1f} false episodes / 1,000 h ({row['episodes']} in {row['hours']:.0f} h)")
            elif row["late"]:
                cells.append(f"warned {min(row['share']):.0f} % (least) / {statistics.median(row['share']):.0f} % "
                             f"(median) of the time from the missed cleanup to full; at worst "
                             f"{max(row['late']):.2f} periods after it was due")
            else:
                cells.append(f"least lead {hm(min(row['lead']))}; ETA error {pct(row['err'])}")
        print(f"| {family} | {cells[0]} | {cells[1]} | {' '.join(map(str, rows['trainguard']['bad'])) or '-'} |",
              flush=True)
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
