"""The progress watchdog's rule, checked against a plain reference written here: the longest gap between
progress events (each decayed by its age), times the factor, never under the floor; the start-up grace
before the first event; and the GPU corroboration at its boundaries."""

from __future__ import annotations

import itertools
import math
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard import config as configmod
from trainguard.detectors.progress import (
    HANG_PREFIX,
    detect_exits,
    detect_hangs,
    fold_stalls,
    timeout_of,
)
from trainguard.records import (
    Finding,
    GpuSample,
    RankSample,
    RunEnd,
    RunSample,
    Severity,
)
from trainguard.store.progress import (
    GAP_HALF_LIFE,
    Cadence,
    ProgressBook,
    advance,
    from_json,
    gpu_state,
    to_json,
)

T0 = 1_800_000_000.0
CONTRACT_KEYS = {"run", "ranks", "gpu_evidence", "silent_for_s", "timeout_s", "last_progress_ts"}


def progress_cfg(**kw) -> configmod.Progress:
    return configmod.parse({"progress": kw}, "test").progress


def run_at(mark: int, cpu: float = 1.0, gpus=(0,), blocked: int = 0, main: bool = False,
           name: str = "torchrun-4121") -> RunSample:
    rank = RankSample(4122, 0, mark, cpu, blocked_threads=blocked, main_blocked=main, gpus=tuple(gpus))
    return RunSample("4121@77", name, (rank,))


def gpu(util: float | None, power: float | None, limit: float = 400.0, index: int = 0) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", "A100", T0, util_ratio=util, power_w=power, power_limit_w=limit)


def drive(times: list[float], cycle: float = 60.0) -> Cadence:
    """The cadence after progress events at `times`, the daemon looking every `cycle` seconds in between."""
    c, mark = None, 0
    start = times[0] - cycle
    c = advance(c, run_at(mark), {}, start, max_step=3 * cycle)
    now = start
    for t in times:
        while now + cycle < t:  # quiet cycles
            now += cycle
            c = advance(c, run_at(mark), {}, now, max_step=3 * cycle)
        now, mark = t, mark + 1
        c = advance(c, run_at(mark), {}, now, max_step=3 * cycle)
    return c


def reference_timeout(times: list[float], factor: float, floor: float, grace: float) -> tuple[float, float]:
    """The rule, brute force: every gap between consecutive events, decayed from when it ended to the last
    event, the longest of them times the factor, floored; no event yet: the grace from the first sight."""
    if not times:
        return grace, None
    gaps = [(b - a) * 0.5 ** ((times[-1] - b) / GAP_HALF_LIFE) for a, b in itertools.pairwise(times)]
    return max(floor, factor * max(gaps, default=0.0)), times[-1]


gaps_strategy = st.lists(st.floats(min_value=10.0, max_value=4 * 3600.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(gaps=gaps_strategy, factor=st.floats(1.0, 10.0), floor=st.floats(10.0, 3600.0))
def test_the_learned_timeout_is_the_decayed_longest_gap_times_the_factor_never_under_the_floor(gaps, factor, floor):
    # Events land on cycle boundaries (60 s), as the daemon sees them.
    times = [T0]
    for g in gaps:
        times.append(times[-1] + 60.0 * max(1, round(g / 60.0)))
    cfg = progress_cfg(factor=factor, min_silence=f"{floor}s")
    timeout, since = timeout_of(cfg, drive(times))
    want, want_since = reference_timeout(times, factor, floor, cfg.startup_grace)
    assert since == want_since
    assert math.isclose(timeout, want, rel_tol=1e-9)


@settings(max_examples=40, deadline=None)
@given(gaps=gaps_strategy)
def test_a_run_is_called_hung_exactly_past_its_timeout(gaps):
    times = [T0]
    for g in gaps:
        times.append(times[-1] + 60.0 * max(1, round(g / 60.0)))
    cfg = progress_cfg()
    c = drive(times)
    timeout, since = reference_timeout(times, cfg.factor, cfg.min_silence, cfg.startup_grace)
    run = run_at(len(times), gpus=(), blocked=1)  # no GPU data: judged by every gap (mode "all")
    assert detect_hangs(cfg, [run], {run.run_id: c}, [], since + timeout - 1e-6) == []
    [hang] = detect_hangs(cfg, [run], {run.run_id: c}, [], since + timeout + 1e-3)
    assert hang.key == HANG_PREFIX + "torchrun-4121" and hang.severity is Severity.CRITICAL


def test_a_spin_is_judged_by_past_spins_not_by_long_evaluations():
    """Evaluations of 20 minutes at training power teach the computing mode a 20-minute gap; a collective
    that spins after them is still called at the floor; an idle silence is judged by every gap."""
    cfg = progress_cfg(min_silence="5m")
    computing, idle, spinning = {0: gpu(0.95, 300.0)}, {0: gpu(0.0, 60.0)}, {0: gpu(1.0, 70.0)}
    c, t, mark = None, T0, 0

    def cycle(gpus, progressed: bool):
        nonlocal c, t, mark
        t += 10.0
        mark += progressed
        c = advance(c, run_at(mark), gpus, t, max_step=30)

    for _ in range(3):
        for _ in range(30):
            cycle(computing, True)
        for _ in range(120):  # a 20-minute evaluation: no progress, GPU computing
            cycle(computing, False)
        cycle(computing, True)
        for _ in range(48):  # an 8-minute checkpoint save: no progress, GPU idle
            cycle(idle, False)
        cycle(computing, True)
    assert c.normal_gap("computing") == pytest.approx(1210.0, rel=1e-2)
    assert c.normal_gap("idle") == pytest.approx(490.0, rel=1e-3)
    assert c.normal_gap("spinning") == 0.0 and c.normal_gap() == pytest.approx(1210.0, rel=1e-2)
    run, last = run_at(mark), t
    assert detect_hangs(cfg, [run], {run.run_id: c}, list(spinning.values()), last + 300) == []
    [hang] = detect_hangs(cfg, [run], {run.run_id: c}, list(spinning.values()), last + 301)
    assert hang.details["timeout_s"] == 300.0 and hang.details["gpu_evidence"] == "spinning"
    assert detect_hangs(cfg, [run], {run.run_id: c}, list(idle.values()), last + 3 * 1200) == []
    assert detect_hangs(cfg, [run], {run.run_id: c}, list(idle.values()), last + 3 * 1210)


def test_before_the_first_progress_the_startup_grace_counts_from_first_sight():
    cfg = progress_cfg(startup_grace="10m")
    c = advance(None, run_at(0), {}, T0, max_step=30)
    assert timeout_of(cfg, c) == (600.0, T0)
    run, idle = run_at(0), [gpu(0.0, 60.0)]
    assert detect_hangs(cfg, [run], {run.run_id: c}, idle, T0 + 600) == []
    assert detect_hangs(cfg, [run], {run.run_id: c}, idle, T0 + 601)


def test_the_silence_of_a_hang_is_not_learned_as_a_normal_gap():
    book = ProgressBook(sqlite3.connect(":memory:"))
    book.update([run_at(0)], [], T0, max_step=30)
    book.update([run_at(1)], [], T0 + 10, max_step=30)
    for i in range(2, 60):  # 10 minutes silent, alerted as hung
        book.update([run_at(1)], [], T0 + 10 * i, max_step=30, hung=["torchrun-4121"])
    [c] = book.update([run_at(2)], [], T0 + 600, max_step=30, hung=["torchrun-4121"]).values()
    assert c.gaps == () and c.last_progress == T0 + 600  # the next hang is caught as fast as this one
    [c] = book.update([run_at(3)], [], T0 + 610, max_step=30).values()
    assert c.gaps == (10.0,)


def test_a_gap_across_a_daemon_that_was_away_is_not_learned():
    c = advance(None, run_at(0), {}, T0, max_step=30)
    c = advance(c, run_at(1), {}, T0 + 10, max_step=30)
    c = advance(c, run_at(2), {}, T0 + 20, max_step=30)
    c = advance(c, run_at(3), {}, T0 + 3620, max_step=30)  # the daemon was stopped for an hour
    assert c.gaps == (10.0,) and c.last_progress == T0 + 3620


@pytest.mark.parametrize(("util", "power", "learned", "want"), [
    (1.0, 99.9, 200.0, "spinning"),  # under half its training power
    (1.0, 100.0, 200.0, "computing"),  # at half: could be a light phase of real work
    (0.9, 50.0, 200.0, "spinning"),
    (0.899, 50.0, 200.0, "computing"),  # not busy enough to call it a spin
    (0.05, 300.0, 200.0, "idle"),
    (0.051, 60.0, 200.0, "computing"),
    (1.0, 119.9, None, "spinning"),  # nothing learned: under 30 % of the 400 W limit
    (1.0, 120.0, None, "computing"),
    (None, 60.0, 200.0, None),
])
def test_gpu_corroboration_at_its_boundaries(util, power, learned, want):
    assert gpu_state(gpu(util, power), learned) == want


def test_a_silent_run_whose_gpus_compute_at_training_power_is_a_long_evaluation_not_a_hang():
    cfg = progress_cfg(min_silence="60s")
    c = drive([T0 + 10 * i for i in range(20)], cycle=10.0)
    run = run_at(20)
    at = T0 + 200 + 61
    assert detect_hangs(cfg, [run], {run.run_id: c}, [gpu(0.97, 350.0)], at) == []
    [hang] = detect_hangs(cfg, [run], {run.run_id: c}, [gpu(1.0, 70.0)], at)
    assert set(hang.details) >= CONTRACT_KEYS
    assert hang.details["gpu_evidence"] == "spinning"
    [rank] = hang.details["ranks"]
    assert set(rank) >= {"rank", "pid", "gpu", "last_progress_ts", "cpu_s"} and rank["pid"] == 4122


def test_a_rank_whose_main_thread_is_blocked_in_io_is_hung_whatever_its_gpu_shows():
    cfg = progress_cfg(min_silence="60s")
    c = drive([T0 + 10 * i for i in range(5)], cycle=10.0)
    at = T0 + 40 + 61
    computing = [gpu(0.6, 250.0)]
    side_thread = run_at(5, blocked=1)  # a background writer in I/O: the GPU still says what the run does
    assert detect_hangs(cfg, [side_thread], {side_thread.run_id: c}, computing, at) == []
    main = run_at(5, blocked=1, main=True)
    [hang] = detect_hangs(cfg, [main], {main.run_id: c}, computing, at)
    assert hang.details["gpu_evidence"] == "blocked"


def test_without_gpus_a_blocked_rank_or_no_cpu_time_corroborates():
    cfg = progress_cfg(min_silence="60s")
    c = drive([T0 + 10 * i for i in range(5)], cycle=10.0)
    at = T0 + 40 + 61
    blocked = run_at(5, gpus=(), blocked=1)
    [hang] = detect_hangs(cfg, [blocked], {blocked.run_id: c}, [], at)
    assert hang.details["gpu_evidence"] == "blocked"
    spinning_cpu = run_at(5, cpu=9.0, gpus=())
    moved = advance(c, spinning_cpu, {}, at, max_step=30)
    assert detect_hangs(cfg, [spinning_cpu], {spinning_cpu.run_id: moved}, [], at) == []
    still = advance(moved, spinning_cpu, {}, at + 10, max_step=30)
    [hang] = detect_hangs(cfg, [spinning_cpu], {spinning_cpu.run_id: still}, [], at + 10)
    assert hang.details["gpu_evidence"] == "no_cpu"


def test_the_training_power_is_learned_while_the_run_progresses():
    c = None
    for i in range(10):
        c = advance(c, run_at(i + 1), {0: gpu(0.95, 300.0 + i)}, T0 + 10 * i, max_step=30)
    assert c.training_power(0) == 308.0  # the 90th percentile of 300..309
    assert c.training_power(1) is None


def test_a_stall_on_the_hangs_gpus_is_folded_into_it_and_another_gpu_keeps_its_own():
    hang = Finding(HANG_PREFIX + "r", Severity.CRITICAL, "s", details={"gpus": [0, 1]})
    stall0 = Finding("gpu.stall:0", Severity.CRITICAL, "s", details={"gpu": 0, "stalled_for_s": 600.0})
    stall5 = Finding("gpu.stall:5", Severity.CRITICAL, "s", details={"gpu": 5})
    out = fold_stalls([stall0, hang, stall5])
    assert [f.key for f in out] == [HANG_PREFIX + "r", "gpu.stall:5"]
    assert out[0].details["stalls"][0]["gpu"] == 0 and out[0].details["stalls"][0]["stalled_for_s"] == 600.0
    assert fold_stalls([stall0, stall5]) == [stall0, stall5]


def test_a_run_that_ended_with_an_error_is_an_exit_warning_and_a_clean_end_is_none():
    ends = [RunEnd("1@2", "torchrun-1", T0, "RuntimeError: boom"), RunEnd("3@4", "torchrun-3", T0, "")]
    [f] = detect_exits(ends)
    assert f.key == "train.exit:torchrun-1" and f.severity is Severity.WARNING
    [k] = detect_exits([RunEnd("5@6", "torchrun-5", T0, "Killed", how="killed")])
    assert k.details["how"] == "killed" and k.summary == "training run torchrun-5 was killed: Killed"


def test_the_cadence_survives_a_restart_through_the_state_db(tmp_path):
    db = tmp_path / "state.db"
    book = ProgressBook(sqlite3.connect(db))
    c = drive([T0 + 10 * i for i in range(6)] + [T0 + 650], cycle=10.0)
    book.cadences[c.run_id] = c
    book.save(T0 + 650)
    book.conn.close()
    again = ProgressBook(sqlite3.connect(db)).load(T0 + 700)
    assert from_json(to_json(c)) == c
    assert again[c.run_id].normal_gap() == c.normal_gap() == 600.0
    assert ProgressBook(sqlite3.connect(db)).load(T0 + 3 * 86400) == {}  # forgotten when long gone


def test_a_malformed_row_is_named_once_and_skipped(tmp_path, caplog):
    conn = sqlite3.connect(tmp_path / "state.db")
    book = ProgressBook(conn)
    c = drive([T0, T0 + 10], cycle=10.0)
    book.cadences[c.run_id] = c
    book.save(T0 + 10)
    conn.execute("INSERT INTO run_progress(run, seen, state) VALUES ('9@9', ?, '{\"name\": 1')", (T0,))
    conn.commit()
    assert list(ProgressBook(conn).load(T0 + 20)) == [c.run_id]
    assert [r.getMessage() for r in caplog.records] == [
        "state db table run_progress: skipped 1 malformed row(s); those runs learn their cadence anew"]
