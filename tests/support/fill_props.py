"""Generated free-space traces and their replay through the daemon's own forecast path, for the property
tests of the fill forecast (tests/test_forecast_properties.py) and their longer run (bench/forecast_properties.py).

A trace is simulated on a 10 s grid of true time from parameters hypothesis draws: what the disk does
(a steady fill, a leak, checkpoint steps, a saw-tooth that fills, a GC that keeps up and may stop, downloads,
logs rotated away), the measurement noise (Gaussian, or heavy-tailed with outliers), and what happens to the
daemon watching it (restarts at random moments with their downtime, wall-clock steps).

`replay` feeds it sample by sample, stamped with the wall clock, into the daemon's History, and evaluates
the forecast as the daemon does (detectors.follow.follow_trend with its carried Fit, detectors.forecast.level
with the default [forecast], the alert's hysteresis kept across restarts as the lifecycle keeps it); the
learned cleanup cycles go through the state database's table (store.cycles) and a restart starts from them.
"""

from __future__ import annotations

import math
import random
import sqlite3
from dataclasses import dataclass, field

from hypothesis import assume
from hypothesis import strategies as st
from trainguard.config import Forecast
from trainguard.detectors.follow import REFIT_EVERY, follow_trend, learned, seeded
from trainguard.detectors.forecast import level
from trainguard.store.cycles import LearnedCycles
from trainguard.store.history import History

from tests.support.plain_fit import plain_warnings

STEP = 10.0
H = 3600.0
GB = 1e9
CFG = Forecast()
NAME = "fs.avail_bytes:/data"
EVERY = 60.0  # seconds between evaluations (the daemon: 10; a minute keeps the suite fast)
REFIT_SLACK = REFIT_EVERY  # the daemon's carried fit is a full fit at most this old (detectors.follow)
LONG = 300.0  # between evaluations of traces longer than two days


@dataclass(frozen=True)
class Noise:
    sigma: float  # bytes
    heavy: bool = False  # Student's t (3 degrees of freedom) instead of Gaussian ...
    outliers: float = 0.0  # ... and this share of samples off by 10-40 sigma either way

    def draw(self, rng: random.Random) -> float:
        if not self.heavy:
            return rng.gauss(0.0, self.sigma)
        e = rng.gauss(0.0, self.sigma) / math.sqrt(sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3)) / 3)
        if rng.random() < self.outliers:
            e += rng.choice((-1, 1)) * rng.uniform(10, 40) * self.sigma
        return e


@dataclass(frozen=True)
class Trace:
    family: str
    size: float
    avail: tuple[float, ...] = field(repr=False)  # free bytes every STEP of true time, before noise
    noise: Noise
    seed: int
    full_at: float | None = None  # true seconds until the disk is full; None: it never fills
    downtime: tuple[tuple[float, float], ...] = ()  # (from, to): the daemon is down (a restart)
    clock_steps: tuple[tuple[float, float], ...] = ()  # (at, seconds) the wall clock jumps by
    missed_at: float | None = None  # a rhythm that stops: when its first missed cleanup was due
    late: float = 0.0  # and how late a cleanup of it may come (its jitter)
    params: dict = field(default_factory=dict)  # what was drawn, for the report of a counter-example
    churn: tuple[float, float] | None = None  # (from, to): a first deletion in sight may be a churn not yet seen

    def down(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.downtime)

    def samples(self):
        """(true time, wall time, measured free bytes) of each sample the daemon takes."""
        rng = random.Random(self.seed)
        offset, steps = 0.0, sorted(self.clock_steps)
        for k, value in enumerate(self.avail):
            t = k * STEP
            while steps and steps[0][0] <= t:
                offset += steps.pop(0)[1]
            if not self.down(t):
                yield t, t + offset, min(max(value + self.noise.draw(rng), 0.0), self.size)


@dataclass(frozen=True)
class Replay:
    times: list[float]  # true times of the evaluations (none while the daemon is down)
    alerting: list[bool]
    etas: list[float | None]

    def warned_since(self) -> float | None:
        """When the alert still on at the last evaluation began."""
        return episode_start(self.times, self.alerting)


def episode_start(times, on) -> float | None:
    if not on or not on[-1]:
        return None
    k = len(on) - 1
    while k > 0 and on[k - 1]:
        k -= 1
    return times[k]


def replay(trace: Trace, every: float = EVERY) -> Replay:
    """The daemon's forecast at every `every` s of true time."""
    history, store = History(None, window=CFG.window), LearnedCycles(sqlite3.connect(":memory:"))
    fit, active, was_down = None, None, False
    out = Replay([], [], [])
    samples = trace.samples()
    pending = next(samples, None)
    end = trace.full_at if trace.full_at is not None else len(trace.avail) * STEP
    for k in range(1, int(end // every) + 1):
        now = k * every
        while pending is not None and pending[0] <= now:
            history.record(pending[1], {NAME: pending[2]})
            pending = next(samples, None)
        if trace.down(now):
            was_down = True
            continue
        last = history.latest(NAME)
        if last is None:
            continue
        wall = last[0]
        if was_down:  # a new process: its Fit is gone, the learned cycles are read back
            fit, was_down = seeded(store.load(wall).get(NAME, ())), False
        trend, fit = follow_trend(fit, lambda since: history.points(NAME, since), trace.size, wall, CFG)
        store.save(NAME, learned(fit), wall)
        alert = level(trend, CFG, active)
        active = alert[0] if alert else None
        out.times.append(now)
        out.alerting.append(alert is not None)
        out.etas.append(trend.eta if trend else None)
    return out


# ---- the disks, from plain parameters ---------------------------------------------------------------
# Each shape is a pure function of a dict of numbers (what hypothesis drew), so a counter-example is
# rebuilt exactly from the Trace's repr: trace(family, params, noise, seed, downtime, clock_steps).

@dataclass(frozen=True)
class Disk:
    size: float
    avail: tuple[float, ...]
    full_at: float | None = None
    missed_at: float | None = None
    late: float = 0.0
    gross: float = 0.0  # bytes/s written at most before the first deletion (never-filling GCs)
    churn: tuple[float, float] | None = None  # (from, to): a first deletion in sight may be a churn not yet seen


def _run(n: int, free: float, per_step) -> tuple[float, ...]:
    """Free space over n steps; per_step(k, free) -> bytes written in step k (negative: freed)."""
    out = []
    for k in range(n):
        out.append(free)
        free -= per_step(k, free)
    return tuple(out)


def _until_full(size: float, avail: tuple[float, ...], **kw) -> Disk:
    end = next(k for k, v in enumerate(avail) if v <= 0)
    return Disk(size, avail[:end + 1], full_at=end * STEP, **kw)


def _ticks(first: float, every: float, jitter: float, end: float, rng: random.Random) -> list[float]:
    out, t = [], first
    while t < end:
        out.append(t)
        t += every * rng.uniform(1 - jitter, 1 + jitter)
    return out


def _steady(p: dict) -> Disk:
    """A constant writer with a slow wobble (a leak: the same on a small disk with little room)."""
    rate = p["size"] * p["free"] / p["ttf"]
    return _until_full(p["size"], _run(int(p["ttf"] * 1.2 / STEP), p["size"] * p["free"], lambda k, _f: rate * STEP * (
        1 + p["wobble"] * math.sin(2 * math.pi * k * STEP / p["period"]))))


def _staircase(p: dict) -> Disk:
    """A checkpoint every 10-60 min, each written over 30-300 s, on a little background; the intervals
    scatter by up to `jitter` (10 %: a steady trainer; 50 %: saves at evaluations, epochs of uneven
    length), the sizes by up to `sizes`."""
    rate = p["size"] * p["free"] / p["ttf"]
    rng, every, background = random.Random(p["rng"]), p["every"], rate * p["background"]
    jitter, sizes, of_size = p.get("jitter", 0.1), p.get("sizes", 0.0), random.Random(p["rng"] + 1)
    ckpt = (rate - background) * every
    starts = {int(t / STEP): ckpt * of_size.uniform(1 - sizes, 1 + sizes)
              for t in _ticks(rng.uniform(0, every), every, jitter, p["ttf"] * 1.3, rng)}
    nsteps = max(int(p["write"] / STEP), 1)

    def per_step(k: int, _f: float) -> float:
        return background * STEP + sum(starts.get(k - j, 0.0) / nsteps for j in range(nsteps))

    return _until_full(p["size"], _run(int(p["ttf"] * 1.2 / STEP), p["size"] * p["free"], per_step))


def _sawtooth_fill(p: dict) -> Disk:
    """A cron cleanup (on time to 2 %) that frees `share` of what is written each period: it fills."""
    rate = p["size"] * p["free"] / p["ttf"]
    gross = rate / (1 - p["share"])
    period = p["period"]
    rng = random.Random(p["rng"])
    cleanups = {int(t / STEP) for t in _ticks(p["first"] * period, period, 0.02, p["ttf"] * 1.3, rng)}
    return _until_full(p["size"], _run(int(p["ttf"] * 1.2 / STEP), p["size"] * p["free"], lambda k, _f: gross * STEP - (
        p["share"] * gross * period if k in cleanups else 0.0)))


def _gc(p: dict) -> Disk:
    """A GC between two levels, at its high-water mark or on a timer (period +-25 %), steady or
    checkpoint-sized writes, depth +-30 % and the writer's pace +-20 % from cycle to cycle."""
    size, high, depth, period = p["size"], p["high"], p["depth"], p["period"]
    rate, rng, every = depth * size / period, random.Random(p["rng"]), p["every"] * period
    state = {"next_gc": period * p["first"], "trigger": high, "acc": 0.0, "pace": 1.0}

    def per_step(k: int, f: float) -> float:
        t = k * STEP
        written = rate * STEP * state["pace"]
        if p["stepped"]:  # banked and written as one checkpoint every `every`
            state["acc"] += written
            written = 0.0
            if t % every < STEP:
                written, state["acc"] = state["acc"], 0.0
        used = 1 - f / size
        if (t >= state["next_gc"]) if p["timer"] else used >= state["trigger"]:
            target = high - depth * rng.uniform(0.7, 1.3)
            state["pace"] = rng.uniform(0.8, 1.2)
            state["next_gc"] = t + period * rng.uniform(0.75, 1.25)
            state["trigger"] = min(high + depth * rng.uniform(-0.1, 0.1), 0.985)
            return written - max((used - target) * size, 0.0)
        return written

    # The GC ran before the daemon started: on a timer, the disk is where its steady cycle puts it `first`
    # of a period before the next cleanup, so the first one the daemon sees frees what a period writes (a
    # first tooth shallower than the rest would be a churn no forecaster could know from it).
    start = size * (1 - high + depth * (p["first"] if p["timer"] else p["start"]))
    return Disk(size, _run(int(p["hours"] * H / STEP), start, per_step), gross=rate * 1.2)


def _downloads(p: dict) -> Disk:
    """One to three downloads at 5-120 MB/s, a little logging besides; each leaves more room than was
    written in the window before its end, so no ETA is ever shorter than the evidence for it."""
    size, n, rng = p["size"], int(p["hours"] * H / STEP), random.Random(p["rng"])
    free = size * p["free"]
    logs = free * p["logs"] / H
    events, t, left = [], p["first"], free - logs * n * STEP
    for _ in range(p["count"]):
        speed = rng.uniform(5e6, 120e6)
        recent = sum(d * sp for s, d, sp in events if s + d > t - CFG.window)
        cap = (left - 1.3 * recent) / 2.3
        if cap <= 0:
            break
        nbytes = min(left * rng.uniform(0.05, 0.6), cap * rng.uniform(0.3, 1.0))
        events.append((t, nbytes / speed, speed))
        left -= nbytes
        t += nbytes / speed + rng.uniform(0.5, 12) * H
    return Disk(size, _run(n, free, lambda k, _f: logs * STEP + sum(
        sp * STEP for s, d, sp in events if s <= k * STEP < s + d)))


def _logs(p: dict) -> Disk:
    """Logs with bursts rotated away every 2-24 h (+-30 %); the lowest point before a rotation is at least
    1.5 x a window of the average pace from full."""
    size, rng, end = p["size"], random.Random(p["rng"]), p["hours"] * H
    base, burst, burst_every, rotate = size * p["base"] / H, size * p["burst"], p["burst_every"], p["rotate"]
    pace = base + burst / burst_every
    free = pace * rotate * 1.3 + 1.5 * CFG.window * pace * p["room"]
    bursts = {int(t / STEP) for t in _ticks(rng.uniform(0.1, 1.0) * burst_every, burst_every, 0.3, end, rng)}
    rotations = {int(t / STEP) for t in _ticks(rng.uniform(0.1, 1.0) * rotate, rotate, 0.3, end, rng)}
    since = [0.0]

    def per_step(k: int, _f: float) -> float:
        w = base * STEP + (burst * rng.uniform(0.5, 1.5) if k in bursts else 0.0)
        if k in rotations:
            w -= since[0]
            since[0] = 0.0
        since[0] += max(w, 0.0)
        return w

    # Bursts and periods drawn long together write more than `free` allows for: it starts higher, so that the
    # lowest point keeps its margin; too much for the disk, it writes less, scaled (a free space clamped
    # instead would look like a fill, hours from full with no rotation seen in a day).
    written = [-v for v in _run(int(end / STEP), 0.0, per_step)]
    free = max(free, max(written) + 1.5 * CFG.window * pace)
    scale = min(1.0, 0.99 * size / free)
    return Disk(size, tuple(scale * (free - w) for w in written))


def _stopping(p: dict) -> Disk:
    """A rhythm that keeps up (a timer, or a GC at its mark: back to `low + depth` free each time) for
    `cycles` cycles, each period off its mean by up to `jitter` (a timer's tick; a GC's writer's pace),
    then none; the writer goes on until the disk is full."""
    size, period, jitter, low, depth = p["size"], p["period"], p["jitter"], p["low"], p["depth"]
    rate, rng, first = depth * size / period, random.Random(p["rng"]), p["first"] * period
    state = {"n": 0, "next": first, "pace": 1.0, "last": 0.0}

    def per_step(k: int, f: float) -> float:
        t = k * STEP
        written = rate * STEP * state["pace"]
        due = t >= state["next"] if p["timer"] else f - written <= low * size
        if due and state["n"] < p["cycles"]:
            state["n"] += 1
            state["last"] = t
            state["next"] = t + period * rng.uniform(1 - jitter, 1 + jitter)
            if not p["timer"]:
                state["pace"] = rng.uniform(1 - jitter, 1 + jitter)
            return written - (low + depth) * size + f
        return written

    # The first tooth reaches the rhythm's low as its first cleanup comes, as every later one does.
    start = low * size + (rate * first if p["timer"] else depth * size * p["start"])
    avail = _run(int(60 * H / STEP), start, per_step)
    # When the next one was due: the timer's next tick, or the GC's level reached at the writer's pace.
    missed = state["next"] if p["timer"] else state["last"] + period / state["pace"]
    return _until_full(size, avail, missed_at=missed, late=3 * jitter * period + 0.2 * period + 2 * EVERY)


def _lossy(p: dict) -> Disk:
    """A cron cleanup every `period` (on time to 2 %) that frees `share` of what was written in its period:
    the lows decline by the rest, from `cycles - 1 + frac` such losses down, and the disk is full in the
    tooth after the `cycles`-th cleanup (a daily cleanup freeing 1 TB of the 1.29 TB written: lows 800,
    510, 220 GB, full 1.3 h before the fourth)."""
    size, period = p["size"], p["period"]
    written = p["depth"] * size  # per period
    gross, loss = written / period, (1 - p["share"]) * written
    low = (p["cycles"] - 1 + p["frac"]) * loss
    rng = random.Random(p["rng"])
    end = (p["first"] + p["cycles"] + 1.5) * period
    ticks = _ticks(p["first"] * period, period, 0.02, end, rng)
    cleanups = {int(t / STEP) for t in ticks}
    return _until_full(size, _run(int(end / STEP), low + gross * p["first"] * period, lambda k, _f: gross * STEP - (
        p["share"] * written if k in cleanups else 0.0)), churn=_churn(ticks, p["share"] * written, gross))


def _accelerating(p: dict) -> Disk:
    """A fill whose rate grows `accel` times a day (a run that saves more as it goes), full at `ttf`."""
    day, a = 86400.0, p["accel"]
    total = p["size"] * p["free"]
    r0 = total / p["ttf"] if a <= 1.0 else total * math.log(a) / day / (a ** (p["ttf"] / day) - 1)
    return _until_full(p["size"], _run(int(p["ttf"] * 1.2 / STEP), total,
                                       lambda k, _f: r0 * a ** (k * STEP / day) * STEP))


def _warm_rm(p: dict) -> Disk:
    """A fill seen from the daemon's fresh start, with one small rm (`share` of what was written by then)
    at `at` of the way to full: a deletion in sight that no churn explains."""
    rate = p["size"] * p["free"] / p["ttf"]
    rm = int(p["at"] * p["ttf"] / STEP)
    freed = p["share"] * rate * rm * STEP
    return _until_full(p["size"], _run(int(p["ttf"] * 1.5 / STEP), p["size"] * p["free"], lambda k, _f: rate * STEP - (
        freed if k == rm else 0.0)), churn=_churn([rm * STEP], freed, rate))


def _churn(deletions: list[float], freed: float, gross: float) -> tuple[float, float]:
    """When the first deletion, `freed` bytes on a fill of `gross` bytes/s, may be taken for a churn not yet
    seen: from it until the next deletion, or the next one a churn freeing what it writes would have made
    (twice the period freed / gross: jitter; a tenth more, and two evaluations, as measured on noisy samples),
    or the end of warm-up (a window less a restart gap)."""
    first = deletions[0]
    return first, min([first + 2.2 * freed / gross + 2 * EVERY, CFG.window - 900.0] + deletions[1:2])


SHAPES = {"steady": _steady, "leak": _steady, "staircase": _staircase, "saw-tooth that fills": _sawtooth_fill,
          "GC": _gc, "downloads": _downloads, "rotated logs": _logs, "stopping": _stopping, "lossy": _lossy,
          "accelerating": _accelerating, "warm-up rm": _warm_rm}


def trace(family: str, params: dict, noise: Noise, seed: int, downtime=(), clock_steps=()) -> Trace:
    """The trace of a family from its parameters (as a counter-example's repr shows them)."""
    disk = SHAPES[family](params)
    return Trace(family, disk.size, disk.avail, noise, seed, full_at=disk.full_at, downtime=tuple(downtime),
                 clock_steps=tuple(clock_steps), missed_at=disk.missed_at, late=disk.late, params=params,
                 churn=disk.churn)


# ---- what hypothesis draws ---------------------------------------------------------------------------

def _size(draw, lo: float = 50 * GB, hi: float = 4000 * GB) -> float:
    return math.exp(draw(st.floats(math.log(lo), math.log(hi))))


def _noise(draw, size: float) -> Noise:
    sigma = size * draw(st.floats(2e-5, 4e-4))
    if draw(st.booleans()):
        return Noise(sigma)
    return Noise(sigma, heavy=True, outliers=draw(st.floats(0.0, 0.01)))


def _restarts(draw, start: float, end: float, longest: float) -> tuple[tuple[float, float], ...]:
    """0-3 restarts at random moments in [start, end), each down 10 s to `longest`."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.floats(start, end))
        out.append((at, at + draw(st.floats(10.0, longest))))
    return tuple(sorted(out))


def _clock_steps(draw, start: float, end: float) -> tuple[tuple[float, float], ...]:
    return tuple((draw(st.floats(start, end)), draw(st.sampled_from((-1, 1))) * draw(st.floats(30.0, 2 * H)))
                 for _ in range(draw(st.integers(0, 2))))


def _seed(draw) -> int:
    return draw(st.integers(0, 2**32))


@st.composite
def filling(draw) -> Trace:
    """A disk that fills steadily for 12.5-30 h from the daemon's start: a constant writer (with a slow
    wobble), a leak on a small disk, checkpoint steps (their sizes and intervals scattered by up to +-50 %),
    or a cron cleanup that frees less than is written.
    The daemon is restarted at random moments (down 10 s to 10 min); longer gaps and clock steps end at
    least 12.5 h before full, so the fill has been watched whole for 12 h when the warning is due."""
    family = draw(st.sampled_from(("steady", "leak", "staircase", "saw-tooth that fills")))
    p = {"size": _size(draw, 30 * GB, 500 * GB) if family == "leak" else _size(draw),
         "ttf": draw(st.floats(12.5 * H, 30 * H)),
         "free": draw(st.floats(0.03, 0.4) if family == "leak" else st.floats(0.2, 0.95))}
    if family in ("steady", "leak"):
        p.update(wobble=draw(st.floats(0.0, 0.05)), period=draw(st.floats(0.5 * H, 3 * H)))
    elif family == "staircase":
        p.update(every=draw(st.floats(600.0, 3600.0)), write=draw(st.floats(30.0, 300.0)),
                 background=draw(st.floats(0.0, 0.2)), jitter=draw(st.floats(0.1, 0.5)),
                 sizes=draw(st.floats(0.0, 0.5)), rng=_seed(draw))
    else:
        p.update(period=draw(st.floats(0.5 * H, 3 * H)), share=draw(st.floats(0.2, 0.8)),
                 first=draw(st.floats(0.1, 1.0)), rng=_seed(draw))
    disk = SHAPES[family](p)
    assume(disk.full_at >= 12.5 * H)
    quiet_until = disk.full_at - 12.5 * H
    gaps = _restarts(draw, 0.0, disk.full_at, 600.0)
    if quiet_until > 20.0:  # (a restart is down 10 s at least)
        gaps += _restarts(draw, 0.0, quiet_until / 2, quiet_until / 2)
    steps = _clock_steps(draw, 0.0, quiet_until) if quiet_until > 2 * H else ()
    return trace(family, p, _noise(draw, p["size"]), _seed(draw), sorted(gaps), steps)


@st.composite
def never_filling(draw) -> Trace:
    """A disk that never fills, watched from the daemon's fresh start for 24-30 h: a GC between two levels,
    one to three downloads, or bursty logs rotated away. Drawn so that no forecaster could know better than
    to warn (as bench/trace_families.py): a cleanup at least once per window, a download that stops leaving
    more room than it wrote in the window before, no fill with no deletion in sight that is full sooner
    than it has been watched, and no GC whose warm-up the plain line warns on (the daemon must warn
    there). Restarted 0-3 times (down 10 s to 3 h) and its clock stepped 0-2 times."""
    family = draw(st.sampled_from(("GC", "downloads", "rotated logs")))
    p = {"hours": draw(st.floats(24.0, 30.0)), "rng": _seed(draw)}
    if family == "GC":
        p["size"] = _size(draw)
        p["high"] = draw(st.floats(0.33, 0.97))
        p.update(depth=draw(st.floats(0.03, min(0.25, p["high"] - 0.30))), period=draw(st.floats(0.25 * H, 2.5 * H)),
                 timer=draw(st.booleans()), stepped=draw(st.booleans()), every=draw(st.floats(0.08, 0.3)),
                 first=draw(st.floats(0.1, 1.0)), start=draw(st.floats(0.1, 0.9)))
    elif family == "downloads":
        p.update(size=_size(draw, 200 * GB, 4000 * GB), free=draw(st.floats(0.2, 0.9)),
                 logs=draw(st.floats(0.0, 0.002)), first=draw(st.floats(0.0, 10 * H)), count=draw(st.integers(1, 3)))
    else:
        p.update(size=_size(draw, 50 * GB, 2000 * GB), base=draw(st.floats(0.0005, 0.01)),
                 burst=draw(st.floats(0.002, 0.02)), burst_every=draw(st.floats(0.5 * H, 3 * H)),
                 rotate=draw(st.floats(2 * H, 24 * H)), room=draw(st.floats(1.0, 3.0)))
    disk = SHAPES[family](p)
    assume(min(disk.avail) > 0.01 * disk.size)
    if family == "GC":
        # Before its first deletion the daemon sees a plain fill: it must not be one full sooner than watched.
        a = disk.avail
        first = next((k for k in range(1, len(a)) if a[k] > a[k - 1] + 0.004 * disk.size), len(a))
        assume(all(a[k] > 1.3 * disk.gross * k * STEP for k in range(first)))
    end = len(disk.avail) * STEP
    drawn = trace(family, p, _noise(draw, p["size"]), _seed(draw), _restarts(draw, 0.0, end, 3 * H),
                  _clock_steps(draw, 0.0, end))
    if family == "GC":
        # In warm-up, with a deletion in sight, the plain line through everything seen decides
        # (postpone.may_hold): where it warns, the daemon must warn too. A first cleanup that freed less
        # than its period wrote, then a long period, can make it: none could know better than to warn.
        seen = [(t, v) for t, _, v in drawn.samples() if t <= CFG.window]
        assume(not any(plain_warnings(seen, [EVERY * k for k in range(1, int(CFG.window / EVERY) + 1)],
                                      CFG.window, CFG.warning, CFG.evidence_ratio)))
    return drawn


@st.composite
def stopping(draw) -> Trace:
    """A cleanup rhythm that keeps up (a timer, or a GC at a high-water mark) for 3-6 cycles and at least
    a window, then stops while its lows sit at 5-35 % free; the writer goes on until the disk is full.
    Periods 0.5-4 h, each off its mean by up to `jitter` (0-10 %)."""
    p = {"size": _size(draw), "period": draw(st.floats(0.5 * H, 4 * H)), "jitter": draw(st.floats(0.0, 0.1)),
         "low": draw(st.floats(0.05, 0.35))}
    p.update(depth=draw(st.floats(0.05, min(0.5, 0.9 - p["low"]))), timer=draw(st.booleans()),
             first=draw(st.floats(0.1, 1.0)), start=draw(st.floats(0.1, 1.0)), rng=_seed(draw))
    p["cycles"] = max(draw(st.integers(3, 6)), math.ceil((CFG.window - p["first"] * p["period"]) / p["period"]) + 1)
    disk = SHAPES["stopping"](p)
    assume(disk.full_at > disk.missed_at + disk.late)  # full before the cleanup is even late: none could tell
    # The daemon may be restarted now and then (down up to 10 min), but not as the cleanup goes missing.
    gaps = [g for g in _restarts(draw, 0.0, disk.full_at, 600.0) if g[1] < disk.missed_at - p["period"]]
    return trace("stopping", p, _noise(draw, p["size"]), _seed(draw), gaps)


@st.composite
def outrun(draw, share: tuple[float, float] = (0.6, 0.99)) -> Trace:
    """A disk that fills where something might seem to hold it: a lossy cleanup rhythm (periods 1-48 h, 2-3
    cycles seen, each freeing 60-99 % of what was written), a fill that accelerates (x1 to x4 a day), or
    one seen from a fresh start with a small rm in sight (1-15 % of what was written by then). Restarted
    0-3 times (down 10 s to 10 min). `share`: the range of what a lossy rhythm's cleanups free."""
    family = draw(st.sampled_from(("lossy", "accelerating", "warm-up rm")))
    p = {"size": _size(draw)}
    if family == "lossy":
        period = math.exp(draw(st.floats(math.log(H), math.log(48 * H))))
        p.update(period=period, share=draw(st.floats(*share)), depth=draw(st.floats(0.02, 0.3)),
                 cycles=draw(st.integers(2, 3 if period <= 24 * H else 2)), frac=draw(st.floats(0.05, 1.0)),
                 first=draw(st.floats(0.1, 1.0)), rng=_seed(draw))
    elif family == "accelerating":
        p.update(free=draw(st.floats(0.2, 0.95)), ttf=draw(st.floats(12.5 * H, 30 * H)), accel=draw(st.floats(1.0, 4.0)))
    else:
        p.update(free=draw(st.floats(0.2, 0.9)), ttf=draw(st.floats(2 * H, 8 * H)), share=draw(st.floats(0.01, 0.15)),
                 at=draw(st.floats(0.1, 0.8)))
    disk = SHAPES[family](p)
    gaps = _restarts(draw, 0.0, disk.full_at, 600.0)
    return trace(family, p, _noise(draw, p["size"]), _seed(draw), gaps)
