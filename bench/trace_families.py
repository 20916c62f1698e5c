"""Seeded free-space traces of training disks, many per family, drawn from wide parameter ranges.

    from trace_families import draw, FAMILIES
    trace = draw("saw-tooth GC", seed=1234)

Every trace is simulated on a 10 s grid (the daemon's interval) in true time: `avail[k]` is the free
space at `k * STEP` seconds, before measurement noise. A trace also carries what the daemon sees beyond
the values: restarts (gaps in its history: no samples while it is down) and wall-clock steps (the
timestamps it writes jump forward or back while true time goes on).

Filling families reach zero at `full_at` (14-40 h after the start, so a fill that starts with the
daemon has held longer than the warning lead before it is due); the others never fill, and are drawn
so that no forecaster could know better than to warn: a cleanup comes at least once per 6 h window,
and a download that stops leaves more room than was written in the 6 h before it stopped.

The same seed gives the same trace on every machine (random.Random, no global state).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

STEP = 10.0
H = 3600.0
GB = 1e9
NEVER_HOURS = 54.0  # one 6 h window of history, then 48 h judged


@dataclass(frozen=True)
class Trace:
    family: str
    seed: int
    size: float
    avail: list[float]  # free bytes every STEP seconds of true time, noise-free
    noise: float  # +- bytes of jitter added to each sample
    full_at: float | None  # true seconds until avail reaches 0; None: never fills
    judge_from: float = 6 * H  # never-filling: false alerts are counted from here on
    gaps: tuple[tuple[float, float], ...] = ()  # (start, end) true seconds the daemon is down
    clock_steps: tuple[tuple[float, float], ...] = ()  # (at, seconds) the wall clock jumps by
    params: dict = field(default_factory=dict)
    gauss: bool = False  # noise: Gaussian with standard deviation `noise` (else uniform within +- noise)
    missed_at: float | None = None  # a rhythm that stops: when its first missed cleanup was due

    @property
    def hours(self) -> float:
        return len(self.avail) * STEP / H

    def samples(self):
        """(true time, wall time the daemon stamps, measured avail), skipping the gaps."""
        rng = random.Random(self.seed * 7919 + 1)
        offset, steps = 0.0, sorted(self.clock_steps)
        for k, value in enumerate(self.avail):
            t = k * STEP
            while steps and steps[0][0] <= t:
                offset += steps.pop(0)[1]
            if any(a <= t < b for a, b in self.gaps):
                continue
            jitter = rng.gauss(0.0, self.noise) if self.gauss else rng.uniform(-self.noise, self.noise)
            measured = min(max(value + jitter, 0.0), self.size)
            yield t, t + offset, measured


def _size(rng: random.Random, lo: float = 50 * GB, hi: float = 4000 * GB) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _noise(rng: random.Random, size: float) -> float:
    return size * rng.uniform(0.00005, 0.0008)


def _run(n: int, free: float, per_step) -> list[float]:
    """Free space over n steps; per_step(k, free) -> bytes written (negative: freed) in step k."""
    out = []
    for k in range(n):
        out.append(free)
        free -= per_step(k, free)
    return out


def _full(avail: list[float]) -> float | None:
    return next((k * STEP for k, v in enumerate(avail) if v <= 0), None)


def _until_full(avail: list[float]) -> list[float]:
    end = next((k for k, v in enumerate(avail) if v <= 0), len(avail) - 1)
    return avail[:end + 1]


# ---- filling ----------------------------------------------------------------------------------------

def steady_fill(rng: random.Random) -> dict:
    size = _size(rng)
    free, ttf = size * rng.uniform(0.3, 0.9), rng.uniform(14, 40) * H
    rate = free / ttf
    wobble, period, phase = rng.uniform(0, 0.08), rng.uniform(0.5, 3) * H, rng.uniform(0, 2 * math.pi)
    avail = _run(int(ttf * 1.2 / STEP), free,
                 lambda k, f: rate * STEP * (1 + wobble * math.sin(phase + 2 * math.pi * k * STEP / period)))
    return dict(size=size, avail=avail, params=dict(rate_gb_h=rate * H / GB, wobble=wobble))


def checkpoint_steps(rng: random.Random) -> dict:
    size = _size(rng)
    free, ttf = size * rng.uniform(0.3, 0.9), rng.uniform(14, 40) * H
    rate = free / ttf
    every, write = rng.uniform(10, 90) * 60, rng.uniform(30, 300)
    background = rate * rng.uniform(0, 0.2)
    ckpt = (rate - background) * every
    starts, t = [], rng.uniform(0, every)
    while t < ttf * 1.3:
        starts.append((t, ckpt * rng.uniform(0.9, 1.1), write * rng.uniform(0.8, 1.2)))
        t += every * rng.uniform(0.9, 1.1)

    def per_step(k: int, _free: float) -> float:
        t0, t1, out = k * STEP, (k + 1) * STEP, background * STEP
        for s, nbytes, dur in starts:  # few checkpoints overlap a step: scan only the near ones
            if s > t1:
                break
            if s + dur >= t0:
                out += nbytes * max(0.0, min(t1, s + dur) - max(t0, s)) / dur
        return out

    avail = _run(int(ttf * 1.2 / STEP), free, per_step)
    return dict(size=size, avail=avail, params=dict(every_min=every / 60, ckpt_gb=ckpt / GB))


def slow_leak(rng: random.Random) -> dict:
    size = _size(rng, 30 * GB, 500 * GB)
    free, ttf = size * rng.uniform(0.03, 0.4), rng.uniform(14, 40) * H
    rate = free / ttf
    avail = _run(int(ttf * 1.2 / STEP), free, lambda k, f: rate * STEP)
    return dict(size=size, avail=avail, params=dict(rate_gb_h=rate * H / GB))


def accelerating_fill(rng: random.Random) -> dict:
    """A fill whose rate grows x1 to x4 a day (a run that saves more as it goes), full in 14-40 h."""
    size = _size(rng)
    free, ttf, accel = size * rng.uniform(0.3, 0.9), rng.uniform(14, 40) * H, rng.uniform(1.0, 4.0)
    day = 24 * H
    r0 = free / ttf if accel <= 1.0 else free * math.log(accel) / day / (accel ** (ttf / day) - 1)
    avail = _run(int(ttf * 1.2 / STEP), free, lambda k, f: r0 * accel ** (k * STEP / day) * STEP)
    return dict(size=size, avail=avail, params=dict(accel_per_day=accel, first_rate_gb_h=r0 * H / GB))


def scattered_steps(rng: random.Random) -> dict:
    """Checkpoints whose sizes and intervals scatter by up to +-50 % (saves at evaluations, epochs of
    uneven length), on a little background; full in 14-40 h."""
    size = _size(rng)
    free, ttf = size * rng.uniform(0.3, 0.9), rng.uniform(14, 40) * H
    rate = free / ttf
    every = rng.uniform(10, 90) * 60
    background = rate * rng.uniform(0, 0.2)
    ckpt = (rate - background) * every
    writes, t = {}, rng.uniform(0, every)
    while t < ttf * 1.3:
        writes[int(t / STEP)] = ckpt * rng.uniform(0.5, 1.5)
        t += every * rng.uniform(0.5, 1.5)
    avail = _run(int(ttf * 1.2 / STEP), free, lambda k, f: background * STEP + writes.get(k, 0.0))
    return dict(size=size, avail=avail, params=dict(every_min=every / 60, ckpt_gb=ckpt / GB))


def sawtooth_fill(rng: random.Random) -> dict:
    """A cron cleanup that frees less than is written: its lows go down until one reaches zero."""
    size = _size(rng)
    free, ttf = size * rng.uniform(0.3, 0.9), rng.uniform(16, 40) * H
    net = free / ttf
    period = rng.uniform(0.5, 2.5) * H
    frees = size * rng.uniform(0.02, 0.15)
    gross = net + frees / period
    cleanups, t = set(), rng.uniform(0.2, 1) * period
    while t < ttf * 1.3:
        cleanups.add(int(t / STEP))
        t += period * rng.uniform(0.98, 1.02)  # a timer: on time to a minute or two
    # What it deletes (files older than its age limit) follows what was written: a few per cent apart.
    avail = _run(int(ttf * 1.2 / STEP), free,
                 lambda k, f: gross * STEP - (frees * rng.uniform(0.97, 1.03) if k in cleanups else 0.0))
    return dict(size=size, avail=avail, params=dict(period_h=period / H, frees_gb=frees / GB, net_gb_h=net * H / GB))


# ---- never filling ----------------------------------------------------------------------------------

def sawtooth_gc(rng: random.Random) -> dict:
    """A GC between two levels anywhere from 30 % to 97 % used, triggered at the high-water mark
    (checkpoint GC, keep-last) or by a timer (cron); period 15 min to 2.5 h, both jittered."""
    size = _size(rng)
    high = rng.uniform(0.33, 0.97)
    depth = rng.uniform(0.03, min(0.25, high - 0.30))
    period = rng.uniform(0.25, 2.5) * H
    rate = depth * size / period
    timer = rng.random() < 0.4
    stepped = rng.random() < 0.5  # checkpoint-sized writes instead of a steady stream
    every = rng.uniform(0.08, 0.3) * period
    n = int(NEVER_HOURS * H / STEP)
    state = {"next_gc": period * rng.uniform(0.3, 1.0), "trigger": high, "acc": 0.0}
    pace = [rng.uniform(0.8, 1.2)]

    def per_step(k: int, f: float) -> float:
        t = k * STEP
        used = 1 - f / size
        written = rate * STEP * pace[0]
        if stepped:  # bank the stream and write it as one checkpoint every `every`
            state["acc"] += written
            written = 0.0
            if t % every < STEP:
                written, state["acc"] = state["acc"], 0.0
        due = t >= state["next_gc"] if timer else used >= state["trigger"]
        if due:
            target = high - depth * rng.uniform(0.7, 1.3)  # jittered depth
            pace[0] = rng.uniform(0.8, 1.2)  # the writer's pace changes from cycle to cycle
            state["next_gc"] = t + period * rng.uniform(0.75, 1.25)
            state["trigger"] = min(high + depth * rng.uniform(-0.1, 0.1), 0.985)
            return written - max((used - target) * size, 0.0)
        return written

    avail = _run(n, size * (1 - high + depth * rng.uniform(0.1, 0.9)), per_step)
    return dict(size=size, avail=avail, params=dict(high=high, depth=depth, period_h=period / H, timer=timer,
                                                    stepped=stepped))


def downloads(rng: random.Random, first: float | None = None) -> dict:
    """One to three downloads (models, datasets) at 5-120 MB/s, then a flat disk with a little logging.
    Each leaves more room than was written in the 6 h before its end: it did not look like a fill."""
    size = _size(rng, 200 * GB, 4000 * GB)
    free = size * rng.uniform(0.2, 0.9)
    logs = free * rng.uniform(0.0, 0.002) / H
    events, left = [], free - logs * NEVER_HOURS * H
    t = rng.uniform(1, 10) * H if first is None else first
    for _ in range(rng.randint(1, 3)):
        speed = rng.uniform(5e6, 120e6)
        # Downloads one after another read as one fill: what remains after this one must be at least 1.3x
        # what was written in the last 6 h, this one included (then the ETA always exceeds the evidence).
        recent = sum(d * sp for s, d, sp in events if s + d > t - 6 * H)
        cap = (left - 1.3 * recent) / 2.3
        if cap <= 0:
            break
        nbytes = min(left * rng.uniform(0.05, 0.6), cap * rng.uniform(0.3, 1.0))
        events.append((t, nbytes / speed, speed))
        left -= nbytes
        t += nbytes / speed + rng.uniform(0.5, 12) * H

    def per_step(k: int, _f: float) -> float:
        t = k * STEP
        return logs * STEP + sum(speed * STEP for s, d, speed in events if s <= t < s + d)

    avail = _run(int(NEVER_HOURS * H / STEP), free, per_step)
    return dict(size=size, avail=avail, params=dict(downloads=len(events)))


def bursty_logs(rng: random.Random) -> dict:
    """Logs with bursts (eval dumps) rotated away every 2-24 h; the lowest point before a rotation is
    always at least 1.5 x 6 h of the average pace from full."""
    size = _size(rng, 50 * GB, 2000 * GB)
    base = size * rng.uniform(0.0005, 0.01) / H
    burst, burst_every = size * rng.uniform(0.002, 0.02), rng.uniform(0.5, 3) * H
    rotate = rng.uniform(2, 24) * H
    pace = base + burst / burst_every
    free = pace * rotate * 1.3 + 1.5 * 6 * H * pace * rng.uniform(1.0, 3.0)
    bursts = {int(t / STEP) for t in _ticks(rng, burst_every, NEVER_HOURS * H)}
    rotations = {int(t / STEP) for t in _ticks(rng, rotate, NEVER_HOURS * H)}
    since = [0.0]

    def per_step(k: int, _f: float) -> float:
        w = base * STEP + (burst * rng.uniform(0.5, 1.5) if k in bursts else 0.0)
        if k in rotations:
            w -= since[0]
            since[0] = 0.0
        since[0] += max(w, 0.0)
        return w

    written = [-v for v in _run(int(NEVER_HOURS * H / STEP), 0.0, per_step)]
    avail = _lowest_at(written, 1.5 * 6 * H * pace, free, size)
    return dict(size=size, avail=avail, params=dict(rotate_h=rotate / H, burst_every_h=burst_every / H))


def _lowest_at(written: list[float], margin: float, free: float, size: float) -> list[float]:
    """Free space from `free` less what is `written` by each step, starting higher where the writes add up to
    more than `free` less `margin` (bursts and periods drawn long together): the lowest point is `margin`
    from full at least. Too much for the disk, it writes less, scaled: clamping the free space instead would
    leave a disk that does look like a fill, hours from full with no rotation seen in a day."""
    free = max(free, max(written) + margin)
    scale = min(1.0, 0.99 * size / free)
    return [scale * (free - w) for w in written]


def _ticks(rng: random.Random, every: float, end: float) -> list[float]:
    out, t = [], rng.uniform(0.1, 1.0) * every
    while t < end:
        out.append(t)
        t += every * rng.uniform(0.7, 1.3)
    return out


def gaussian_fill(rng: random.Random) -> dict:
    """A steady fill measured with Gaussian noise of 0.05-0.15 % of the disk per sample (a 100 GB disk at
    ~2.2 GB/h with 0.1 GB of noise once went unwarned: two noise blips were taken for a cleanup rhythm)."""
    out = steady_fill(rng)
    out["gauss"] = True
    out["noise"] = out["size"] * rng.uniform(0.0005, 0.0015)
    return out


def stopping_cleanups(rng: random.Random) -> dict:
    """A cleanup timer every 1-8 h that frees what was written (lows 8-35 % free) for 2-4 windows of
    history, then stops; the writer goes on until the disk is full. Scored by the share of the time from
    the missed cleanup to full that a warning is on."""
    size = _size(rng)
    period, low = rng.uniform(1, 8) * H, rng.uniform(0.08, 0.35)
    depth = rng.uniform(0.05, min(0.5, 0.9 - low))
    rate = depth * size / period
    first = rng.uniform(0.1, 1.0) * period
    stop_at = first + period * math.ceil(rng.uniform(2, 4) * 6 * H / period)
    ticks = _timer(rng, first, period, 0.05, stop_at)
    cleanups = {int(t / STEP) for t in ticks}
    top = (low + depth) * size

    def per_step(k: int, f: float) -> float:
        return rate * STEP - (top - f if k in cleanups else 0.0)

    avail = _run(int((stop_at + 2 * period + (low + depth) * size / rate) / STEP), low * size + rate * first,
                 per_step)
    return dict(size=size, avail=avail, missed_at=ticks[-1] + period,
                params=dict(period_h=period / H, low=low, depth=depth, cycles=len(ticks)))


def cleaned_with_restarts(rng: random.Random) -> dict:
    """A disk cleaned by a timer every 4-20 h (+-1 %, the writer's pace +-2 % from cycle to cycle) down from
    near full (lows 5-12 % free), watched by a daemon restarted 1-3 times at random moments (down 1 min-1 h). Judged once two cleanups have been seen (before
    that no forecaster knows a cleanup will come again) for 48 h."""
    size = _size(rng)
    period, low = rng.uniform(4, 20) * H, rng.uniform(0.05, 0.12)
    depth = rng.uniform(0.2, 0.9 - low)
    rate = depth * size / period
    first = rng.uniform(0.1, 1.0) * period
    ticks = _timer(rng, first, period, 0.01, first + 2 * period + 50 * H)  # a timer: on time to minutes
    cleanups = {int(t / STEP) for t in ticks}
    top = (low + depth) * size
    end = ticks[1] + 48 * H
    gaps, t = [], ticks[1] + rng.uniform(0, period)
    for _ in range(rng.randint(1, 3)):
        length = rng.uniform(60, H)
        gaps.append((t, t + length))
        t += length + rng.uniform(1, 2) * period
    pace = [1.0]

    def per_step(k: int, f: float) -> float:
        if k in cleanups:
            pace[0] = rng.uniform(0.98, 1.02)  # the writer's pace changes a little from cycle to cycle
            return rate * STEP * pace[0] - (top - f)
        return rate * STEP * pace[0]

    avail = _run(int(end / STEP), low * size + rate * first, per_step)
    return dict(size=size, avail=avail, judge_from=ticks[1] + 600, gaps=tuple(gaps),
                params=dict(period_h=period / H, low=low, depth=depth))


def _timer(rng: random.Random, first: float, every: float, jitter: float, end: float) -> list[float]:
    out, t = [], first
    while t < end:
        out.append(t)
        t += every * rng.uniform(1 - jitter, 1 + jitter)
    return out


BASES = (sawtooth_gc, downloads, bursty_logs)


def restarts(rng: random.Random) -> dict:
    """A never-filling disk watched by a daemon that is down 1-4 times, 1 min to 3 h each."""
    out = rng.choice(BASES)(rng)
    gaps, t = [], rng.uniform(1, 8) * H
    for _ in range(rng.randint(1, 4)):
        length = math.exp(rng.uniform(math.log(60), math.log(3 * H)))
        gaps.append((t, t + length))
        t += length + rng.uniform(1, 12) * H
    out["gaps"] = tuple(gaps)
    return out


def clock_steps(rng: random.Random) -> dict:
    """A never-filling disk on a host whose wall clock is stepped 1-3 times by 30 s to 2 h, either way."""
    out = rng.choice(BASES)(rng)
    out["clock_steps"] = tuple((rng.uniform(2, 50) * H, rng.choice((-1, 1)) * math.exp(rng.uniform(math.log(30),
                                                                                                 math.log(2 * H))))
                               for _ in range(rng.randint(1, 3)))
    return out


def churn_from_start(rng: random.Random) -> dict:
    """A GC between 85-97 % used at its mark and as much lower as the first tooth can be watched without
    looking full (a period 15 min to 2.5 h), the daemon started just after a cleanup: judged from the start,
    warm-up included."""
    size, high = _size(rng), rng.uniform(0.85, 0.97)
    depth, period = rng.uniform(0.3, 0.75) * (1 - high), rng.uniform(0.25, 2.5) * H
    rate = depth * size / period
    pace, state = [rng.uniform(0.9, 1.1)], {"trigger": high}

    def per_step(k: int, f: float) -> float:
        written = rate * STEP * pace[0]
        if 1 - f / size >= state["trigger"]:
            pace[0] = rng.uniform(0.9, 1.1)
            state["trigger"] = high + depth * rng.uniform(-0.1, 0.1)
            return written - depth * size * rng.uniform(0.8, 1.2)
        return written

    avail = _run(int(NEVER_HOURS * H / STEP), size * (1 - high + depth), per_step)
    return dict(size=size, avail=avail, judge_from=0.0, params=dict(high=high, depth=depth, period_h=period / H))


def downloads_from_start(rng: random.Random) -> dict:
    """Downloads (models, datasets) as a fresh daemon starts: the first within its first hour, judged from
    the start, warm-up included."""
    drawn = downloads(rng, first=rng.uniform(0.0, 1.0) * H)
    return dict(drawn, judge_from=0.0)


FILLING = {"steady fill": steady_fill, "checkpoint steps": checkpoint_steps, "slow leak": slow_leak,
           "saw-tooth that fills": sawtooth_fill, "steady fill, Gaussian noise": gaussian_fill,
           "cleanups that stop": stopping_cleanups, "accelerating fill": accelerating_fill,
           "staircase, scattered": scattered_steps}
NEVER = {"saw-tooth GC": sawtooth_gc, "downloads": downloads, "bursty logs, rotated": bursty_logs,
         "restarts (gaps)": restarts, "clock steps": clock_steps,
         "cleaned every 4-20 h, restarts": cleaned_with_restarts, "churn from a fresh start": churn_from_start,
         "downloads from a fresh start": downloads_from_start}
FAMILIES = {**FILLING, **NEVER}


def draw(family: str, seed: int) -> Trace:
    """One trace of the family; the seed (with the family's name) fixes every parameter and the noise."""
    rng = random.Random(f"{family}/{seed}")
    drawn = FAMILIES[family](rng)
    while family in NEVER and min(drawn["avail"]) < 0.01 * drawn["size"]:
        drawn = FAMILIES[family](rng)  # a jitter that would fill the disk: this one fills; draw again
    while family in FILLING and _full(drawn["avail"]) is None:
        drawn = FAMILIES[family](rng)  # a jitter that leaves it short of full at the end: scored as neither
    size = drawn["size"]
    avail = drawn["avail"]
    filling = family in FILLING
    if filling:
        avail = _until_full(avail)
    return Trace(family=family, seed=seed, size=size, avail=[min(v, size) for v in avail],
                 noise=drawn.get("noise", _noise(rng, size)), full_at=_full(avail) if filling else None,
                 judge_from=drawn.get("judge_from", 6 * H), gaps=drawn.get("gaps", ()),
                 clock_steps=drawn.get("clock_steps", ()), params=drawn.get("params", {}),
                 gauss=drawn.get("gauss", False), missed_at=drawn.get("missed_at"))
