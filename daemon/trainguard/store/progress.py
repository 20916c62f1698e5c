"""The cadence each training run has shown, kept in the state database.

A run makes progress in bursts of several kinds: steps every few seconds, an evaluation pass every
few hundred steps, a checkpoint save every hour. What is normal for it is learned from the gaps between
its progress events: the longest gap seen, decaying with a half-life of GAP_HALF_LIFE so a cadence the
run left behind is forgotten slowly, while an hourly save keeps its gap refreshed. The longest gap is
kept per mode too, by what the run's GPUs did during the silence (MODES: computing in an evaluation, idle
in a checkpoint save, spinning in a collective): a silence with spinning GPUs is then judged against the
spinning silences the run has had, usually none, not against its 30-minute evaluations. A restart in the
middle of a run keeps it all: without it, the next checkpoint save after a restart would look like a hang.
Also learned, per GPU: the power it draws while the run progresses (a high quantile of recent samples),
which tells a GPU that computes from one that spins in a collective.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace

from trainguard.records import GpuSample, RunEnd, RunSample

log = logging.getLogger(__name__)

SCHEMA = """CREATE TABLE IF NOT EXISTS run_progress (
    run TEXT PRIMARY KEY, seen REAL NOT NULL, state TEXT NOT NULL) WITHOUT ROWID"""
GAP_HALF_LIFE = 24 * 3600.0
KEEP = 2 * 86400.0  # a run not seen this long is forgotten
MAX_RUNS = 256
RECENT_GAPS = 32
POWER_SAMPLES = 64
POWER_QUANTILE = 0.9
COMPUTING_UTIL = 0.5  # a power sample counts toward the training level at this utilisation or more
ALL = "all"  # the mode every gap is learned in (a silence without GPU data is judged by it)
MODES = ("computing", "idle", "spinning")
SPIN_UTIL = 0.9
IDLE_UTIL = 0.05
SPIN_POWER_OF_LEARNED = 0.5  # below half its training power, a busy GPU is spinning
SPIN_POWER_OF_LIMIT = 0.3  # without a learned level: below 30 % of its power limit
SAVE_EVERY = 60.0  # seconds between saves of a run whose cadence did not change


@dataclass(frozen=True, slots=True)
class RankMark:
    pid: int
    mark: int
    cpu_s: float
    last_progress: float | None = None


@dataclass(frozen=True, slots=True)
class Cadence:
    run_id: str
    name: str
    first_seen: float
    last_seen: float
    last_progress: float | None = None  # None: no progress event seen yet (start-up)
    longest: tuple[tuple[str, float, float], ...] = ()  # (mode, the decayed longest gap, as of when)
    gaps: tuple[float, ...] = ()  # the most recent gaps, oldest first
    silence: tuple[str, ...] = ()  # the modes the GPUs were in since the last progress
    ranks: tuple[RankMark, ...] = ()
    power: tuple[tuple[int, tuple[float, ...]], ...] = ()  # GPU index -> recent power samples while progressing
    cpu_moved: bool = True  # did any rank use CPU time since the cycle before
    ended_ts: float | None = None  # when its processes were first seen gone (None: running)
    how: str = ""  # how it ended: "finished", "error", "killed", "unknown"
    error: str = ""  # the line of its output that says so

    def normal_gap(self, mode: str = ALL) -> float:
        """The longest normal gap of a mode as of the last progress event (fixed while the run is silent)."""
        if self.last_progress is None:
            return 0.0
        return next((decayed(v, at, self.last_progress) for m, v, at in self.longest if m == mode), 0.0)

    def training_power(self, gpu: int) -> float | None:
        """The GPU's learned power while the run progresses (None until a few samples are in)."""
        samples = dict(self.power).get(gpu, ())
        if len(samples) < 5:
            return None
        ordered = sorted(samples)
        return ordered[int(POWER_QUANTILE * (len(ordered) - 1))]


def decayed(value: float, at: float, now: float) -> float:
    return value * 0.5 ** (max(0.0, now - at) / GAP_HALF_LIFE)


def learn_gap(c: Cadence, gap: float, now: float, modes: tuple[str, ...]) -> Cadence:
    """Learn the gap in ALL and in every mode the GPUs were in during it."""
    learned = {m: (v, at) for m, v, at in c.longest}
    for mode in (ALL, *modes):
        v, at = learned.get(mode, (0.0, now))
        learned[mode] = (max(gap, decayed(v, at, now)), now)
    longest = tuple((m, *learned[m]) for m in (ALL, *MODES) if m in learned)
    return replace(c, longest=longest, gaps=(*c.gaps, gap)[-RECENT_GAPS:])


def gpu_state(g: GpuSample, learned_w: float | None) -> str | None:
    """"spinning", "idle", "computing", or None without a utilisation reading."""
    if g.lost or g.util_ratio is None:
        return None
    if g.util_ratio <= IDLE_UTIL:
        return "idle"
    if g.util_ratio >= SPIN_UTIL and g.power_w is not None:
        if learned_w is not None:
            low = g.power_w < SPIN_POWER_OF_LEARNED * learned_w
        else:
            low = bool(g.power_limit_w) and g.power_w < SPIN_POWER_OF_LIMIT * g.power_limit_w
        if low:
            return "spinning"
    return "computing"


def run_gpu_states(run: RunSample, c: Cadence, gpus: Mapping[int, GpuSample]) -> list[str]:
    """The state of each of the run's GPUs that reads (none without GPU data)."""
    indices = sorted({i for r in run.ranks for i in r.gpus})
    return [s for i in indices if i in gpus and (s := gpu_state(gpus[i], c.training_power(i))) is not None]


def run_mode(states: list[str]) -> str | None:
    """The run's mode from its GPUs' states: computing when any computes, else spinning when any spins."""
    for mode in MODES:
        if mode in states:
            return mode
    return None


def advance(prev: Cadence | None, run: RunSample, gpus: Mapping[int, GpuSample], now: float,
            max_step: float, learn: bool = True) -> Cadence:
    """The run's cadence after this cycle. A rank whose mark changed made progress; a gap is learned
    only when the cycle before was seen within max_step (a daemon that was away knows no gap), and not
    when `learn` is off (the gap was a hang: learned, it would hide the next one)."""
    c = prev or Cadence(run.run_id, run.name, first_seen=now, last_seen=now)
    before = {r.pid: r for r in c.ranks}
    ranks, progressed, cpu_moved = [], False, False
    for r in run.ranks:
        old = before.get(r.pid)
        grew = r.grew_at is not None and r.grew_at > c.last_seen  # a watched log of the run grew since
        moved = old is not None and (old.mark != r.mark or grew)
        progressed |= moved
        cpu_moved |= old is None or r.cpu_s > old.cpu_s
        ranks.append(RankMark(r.pid, r.mark, r.cpu_s, now if moved else (old.last_progress if old else None)))
    mode = run_mode(run_gpu_states(run, c, gpus))
    silence = tuple(m for m in MODES if m in c.silence or m == mode)
    c = replace(c, name=run.name, ranks=tuple(ranks), cpu_moved=cpu_moved, silence=silence, ended_ts=None,
                how="", error="")
    if progressed:
        if learn and c.last_progress is not None and now - c.last_seen <= max_step:
            c = learn_gap(c, now - c.last_progress, now, silence)
        c = replace(c, last_progress=now, power=_learn_power(c.power, run, gpus), silence=())
    return replace(c, last_seen=now)


def _learn_power(power: tuple[tuple[int, tuple[float, ...]], ...], run: RunSample,
                 gpus: Mapping[int, GpuSample]) -> tuple[tuple[int, tuple[float, ...]], ...]:
    learned = dict(power)
    for index in sorted({i for r in run.ranks for i in r.gpus}):
        g = gpus.get(index)
        if g is None or g.power_w is None or g.util_ratio is None or g.util_ratio < COMPUTING_UTIL:
            continue
        learned[index] = (*learned.get(index, ()), g.power_w)[-POWER_SAMPLES:]
    return tuple(sorted(learned.items()))


def to_json(c: Cadence) -> str:
    return json.dumps(asdict(c), separators=(",", ":"))


def from_json(text: str) -> Cadence:
    """Raises ValueError, KeyError or TypeError on a malformed row."""
    d = json.loads(text)
    return Cadence(
        str(d["run_id"]), str(d["name"]), float(d["first_seen"]), float(d["last_seen"]),
        None if d.get("last_progress") is None else float(d["last_progress"]),
        tuple((str(m), float(v), float(at)) for m, v, at in d.get("longest", ())),
        tuple(float(g) for g in d.get("gaps", ())), tuple(str(m) for m in d.get("silence", ())),
        tuple(RankMark(int(r["pid"]), int(r["mark"]), float(r["cpu_s"]),
                       None if r.get("last_progress") is None else float(r["last_progress"]))
              for r in d.get("ranks", ())),
        tuple((int(i), tuple(float(w) for w in ws)) for i, ws in d.get("power", ())),
        bool(d.get("cpu_moved", True)),
        None if d.get("ended_ts") is None else float(d["ended_ts"]), str(d.get("how", "")), str(d.get("error", "")),
    )


def read(conn: sqlite3.Connection, now: float) -> dict[str, Cadence]:
    """The cadences as last saved (none older than KEEP); a malformed row is skipped."""
    try:
        rows = conn.execute("SELECT run, state FROM run_progress WHERE seen >= ?", (now - KEEP,)).fetchall()
    except sqlite3.OperationalError:
        return {}  # a database without the table (an older version wrote it)
    out, bad = {}, 0
    for run_id, state in rows:
        try:
            out[run_id] = from_json(state)
        except (ValueError, KeyError, TypeError):
            bad += 1  # relearned when the run comes back
    if bad:
        log.warning("state db table run_progress: skipped %d malformed row(s); those runs learn their cadence anew",
                    bad)
    return out


class ProgressBook:
    """The cadences of the runs seen, in memory and in the run_progress table."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        conn.execute(SCHEMA)
        self.cadences: dict[str, Cadence] = {}
        self._saved: dict[str, tuple[float, Cadence]] = {}

    def load(self, now: float) -> dict[str, Cadence]:
        """The cadences as last saved; a malformed row is skipped (and overwritten when the run comes back)."""
        self.cadences.update(read(self.conn, now))
        return dict(self.cadences)

    def update(self, runs: Iterable[RunSample], gpus: Iterable[GpuSample], now: float,
               max_step: float, hung: Iterable[str] = (), ended: Iterable[RunEnd] = ()) -> dict[str, Cadence]:
        """hung: the names of the runs whose hang alert is active: their silence is not a gap to learn.
        ended: the runs seen gone, and how they ended (kept so `trainguard status` can say it)."""
        by_index = {g.index: g for g in gpus}
        hung = set(hung)
        for run in runs:
            self.cadences[run.run_id] = advance(self.cadences.get(run.run_id), run, by_index, now, max_step,
                                                learn=run.name not in hung)
        for e in ended:
            c = self.cadences.get(e.run_id)
            if c is not None and c.ended_ts is None:
                self.cadences[e.run_id] = replace(c, ended_ts=e.ts, how=e.how, error=e.error)
        old = sorted(self.cadences.values(), key=lambda c: c.last_seen, reverse=True)
        self.cadences = {c.run_id: c for c in old[:MAX_RUNS] if now - c.last_seen < KEEP}
        return dict(self.cadences)

    def save(self, now: float) -> None:
        """Write the runs whose cadence changed (not just seen again), and every run each SAVE_EVERY."""
        due = []
        for run_id, c in self.cadences.items():
            saved = self._saved.get(run_id)
            if saved is None or now - saved[0] >= SAVE_EVERY or _learned(saved[1]) != _learned(c):
                due.append(c)
        if not due:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM run_progress WHERE seen < ?", (now - KEEP,))
            self.conn.executemany("INSERT OR REPLACE INTO run_progress(run, seen, state) VALUES (?, ?, ?)",
                                  [(c.run_id, c.last_seen, to_json(c)) for c in due])
        for c in due:
            self._saved[c.run_id] = (now, c)


def _learned(c: Cadence) -> tuple:
    return c.last_progress, c.longest, c.silence, tuple((r.pid, r.mark) for r in c.ranks), c.ended_ts
