"""The cross-rank rule on recorded py-spy dumps (a real gloo all_reduce and a DataLoader read from a hung
FUSE share, tests/data/pyspy): which rank holds the others, with its frame, file and mount."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from trainguard.diagnosis.model import ProcessView, ThreadView
from trainguard.diagnosis.ranks import (
    Frame,
    RankSample,
    collective_of,
    dataloader_frame,
    parse_stacks,
    pick,
    rank_pids,
    run_diagnosis,
    still_threads,
    verdict_of,
)
from trainguard.diagnosis.words import run_remedy_text, run_verdict_text
from trainguard.i18n import tr
from trainguard.sources.procs import ThreadInfo

DATA = Path(__file__).parent / "data" / "pyspy"
SHARE, FILE = "/root/autodl-fs", "/root/autodl-fs/data/x.bin"


def _recorded(name: str, pid: int) -> dict:
    """A recorded dump, its main thread renumbered to pid."""
    (stack,) = parse_stacks((DATA / name).read_text()).values()
    return {pid: stack}


def _view(pid: int, blocked: tuple[ThreadView, ...] = ()) -> ProcessView:
    return ProcessView(pid, pid, True, "", "python train.py", None, "S", None, blocked, 12, None, {}, ())


def _waiting(rank: int, pid: int) -> RankSample:
    stacks = _recorded("gloo_all_reduce.json", pid)
    return RankSample(rank, pid, _view(pid), ThreadInfo(pid, "python", "S", "futex_do_wait", "futex"), stacks, stacks)


def _reading(rank: int, pid: int) -> RankSample:
    stacks = _recorded("dataloader_read.json", pid)
    thread = ThreadView(pid, "MainThread", "python", "D", "request_wait_answer", "read", FILE, "", SHARE)
    return RankSample(rank, pid, _view(pid, (thread,)), ThreadInfo(pid, "python", "D", "request_wait_answer", "read", 7),
                      stacks, stacks)


def test_recorded_stacks_are_classified():
    (gloo,) = parse_stacks((DATA / "gloo_all_reduce.json").read_text()).values()
    (loader,) = parse_stacks((DATA / "dataloader_read.json").read_text()).values()
    assert collective_of(gloo) == "all_reduce"
    assert collective_of(loader) == "" and dataloader_frame(loader) == "DataLoader.__next__"
    assert loader[0].at() == "Shard.__getitem__ (ranks.py:10)"


def test_the_odd_rank_out_holds_the_others():
    samples = [_waiting(0, 4118), _waiting(1, 4119), _reading(2, 4121), _waiting(3, 4122)]
    d = run_diagnosis(samples, "py-spy")
    assert d["verdict"] == "rank_holds_collective" and d["collective"] == "all_reduce"
    assert d["waiting_ranks"] == [0, 1, 3]
    holder = d["holder"]
    assert (holder["rank"], holder["pid"], holder["frame"], holder["file"], holder["mount"]) == (
        2, 4121, "DataLoader.__next__", FILE, SHARE)
    assert [r["moved"] for r in d["diagnosis"]] == [False] * 4
    en = run_verdict_text(d, tr("en"))
    assert en.startswith(f"rank 2 (PID 4121) is in DataLoader.__next__ [Shard.__getitem__ (ranks.py:10)] reading "
                         f"{FILE} (mount {SHARE}), D state; ranks 0, 1, 3 wait in all_reduce"), en
    zh = run_verdict_text(d, tr("zh"))
    assert zh.startswith("rank 2（PID 4121）停在 DataLoader.__next__") and FILE in zh
    assert zh.endswith("rank 0, 1, 3 在 all_reduce 中等它"), zh
    remedy = run_remedy_text(d, tr("en"))
    assert SHARE in remedy and "NCCL_DEBUG=WARN" in remedy and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in remedy
    assert "；设置 NCCL_DEBUG=WARN；" in run_remedy_text(d, tr("zh"))
    assert "TORCH_FR_DUMP_TEMP_FILE" in run_remedy_text(d, tr("zh"))


def test_a_data_loader_waiting_for_its_workers():
    stacks = _recorded("dataloader_worker_wait.json", 300)
    waits = RankSample(0, 300, _view(300), ThreadInfo(300, "python", "S", "do_sys_poll", "syscall 7"), stacks, stacks)
    alone = run_diagnosis([waits], "py-spy")
    assert alone["verdict"] == "dataloader_deadlock" and alone["blocked_rank"]["frame"] == "DataLoader.__next__"
    assert "data-loader deadlock" in run_verdict_text(alone, tr("en"))
    assert "DataLoader 死锁" in run_verdict_text(alone, tr("zh"))
    held = run_diagnosis([_waiting(0, 100), dataclasses.replace(waits, rank=1), _waiting(2, 102)], "py-spy")
    assert held["verdict"] == "rank_holds_collective" and held["holder"]["frame"] == "DataLoader.__next__"
    for d in (alone, held):
        assert "py-spy dump --pid on PID 300's children" in run_remedy_text(d, tr("en"))


def test_all_in_the_collective_names_no_rank():
    d = run_diagnosis([_waiting(r, 100 + r) for r in range(4)], "py-spy")
    assert d["verdict"] == "all_in_collective" and d["holder"] is None and d["waiting_ranks"] == [0, 1, 2, 3]
    assert "all 4 ranks here wait in all_reduce" in run_verdict_text(d, tr("en"))


def test_a_stack_that_moved_is_not_waiting():
    moving = _waiting(1, 101)
    later = {101: (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3260),)}
    rows = run_diagnosis([_waiting(0, 100), RankSample(1, 101, moving.view, moving.main, moving.first, later)],
                         "py-spy")["diagnosis"]
    assert rows[1]["moved"] is True and rows[1]["kind"] == "other"


def test_a_gone_rank_holds_the_others():
    d = run_diagnosis([_waiting(0, 100), RankSample(1, 101, None, None, None, None), _waiting(2, 102)], "py-spy")
    assert d["verdict"] == "rank_holds_collective" and d["holder"]["kind"] == "gone"
    assert run_verdict_text(d, tr("en")).startswith("rank 1 (PID 101) has exited; ranks 0, 2 wait in all_reduce")
    assert "dmesg" in run_remedy_text(d, tr("en"))
    zombie = RankSample(1, 101, _view(101), ThreadInfo(101, "python", "Z", ""), None, None)
    assert run_diagnosis([_waiting(0, 100), zombie], "py-spy")["holder"]["kind"] == "gone"


def test_the_most_common_collective_is_named_and_a_tie_goes_to_the_lowest_rank():
    samples = [_waiting(r, 100 + r) for r in range(5)]
    for r in (0, 3):  # barrier: ranks 0 and 3; all_reduce: ranks 1, 2 (a tie), then 4 breaks it
        barrier = {100 + r: (Frame("barrier", "torch/distributed/distributed_c10d.py", 4100),)}
        samples[r] = RankSample(r, 100 + r, samples[r].view, samples[r].main, barrier, barrier)
    assert run_diagnosis(samples, "py-spy")["collective"] == "all_reduce"
    assert run_diagnosis(samples[:4], "py-spy")["collective"] == "barrier"


def test_without_stacks_proc_names_the_blocked_rank_and_says_why():
    bare = [RankSample(s.rank, s.pid, s.view, s.main, None, None)
            for s in (_waiting(0, 100), _reading(1, 101), _waiting(2, 102))]
    d = run_diagnosis(bare, "missing")
    assert d["verdict"] == "blocked_io" and d["holder"] is None
    assert (d["blocked_rank"]["rank"], d["blocked_rank"]["file"], d["blocked_rank"]["mount"]) == (1, FILE, SHARE)
    assert d["stacks_note"].startswith("py-spy is not installed")
    assert [r["kind"] for r in d["diagnosis"]] == ["unknown", "io", "unknown"]
    assert "py-spy is not installed" in run_verdict_text(d, tr("en"))


def test_the_other_threads_that_did_not_move_are_kept():
    a, b, c = (Frame(n, "x.py", 1) for n in "abc")
    first = {1: (a,), 2: (b,), 3: (c, a), 4: ()}
    second = {1: (a,), 2: (c,), 3: (c, a), 4: (), 5: (a,)}
    assert still_threads(1, first, second) == [{"tid": 3, "stack": ["c (x.py:1)", "a (x.py:1)"]}]
    assert still_threads(1, None, second) == []


def test_rank_pids_leaves_bad_entries_out():
    assert rank_pids([{"rank": 0, "pid": 10}, {"rank": "x", "pid": 1}, {"pid": 3}, "junk", {"rank": "2", "pid": 12}]
                     ) == [(0, 10), (2, 12)]
    assert rank_pids(None) == [] and rank_pids({"rank": 0}) == []


@given(st.integers(0, 200), st.sets(st.integers(0, 199), max_size=40))
def test_pick_is_bounded_and_keeps_the_blocked(n, blocked_ranks):
    ranks = [(r, 1000 + r) for r in range(n)]
    blocked = {1000 + r for r in blocked_ranks if r < n}
    chosen = pick(ranks, blocked, 16)
    assert len(chosen) == min(n, 16) and len(set(chosen)) == len(chosen) and set(chosen) <= set(ranks)
    assert len([c for c in chosen if c[1] in blocked]) == min(len(blocked), 16)


KINDS = ("collective", "io", "other", "unknown", "gone")


@given(st.lists(st.sampled_from(KINDS), max_size=8))
def test_odd_one_out_against_a_plain_count(kinds):
    rows = [{"rank": i, "pid": i, "kind": k} for i, k in enumerate(kinds)]
    verdict, named = verdict_of(rows)
    not_waiting = [i for i, k in enumerate(kinds) if k != "collective"]
    if len(kinds) >= 2 and len(not_waiting) == 1 and kinds[not_waiting[0]] != "unknown":
        assert verdict == "rank_holds_collective" and named["rank"] == not_waiting[0]
    else:
        assert verdict != "rank_holds_collective"
    assert (verdict == "all_in_collective") == (len(kinds) > 0 and not not_waiting)


BACKWARD = (Frame("_engine_run_backward", "torch/autograd/graph.py", 829),
            Frame("backward", "torch/autograd/__init__.py", 347), Frame("backward", "torch/_tensor.py", 648),
            Frame("train_step", "train.py", 41), Frame("<module>", "train.py", 80))


def _in_backward(rank: int, pid: int, moved: bool = False) -> RankSample:
    later = (BACKWARD[0]._replace(line=830), *BACKWARD[1:]) if moved else BACKWARD
    return RankSample(rank, pid, _view(pid), ThreadInfo(pid, "python", "S", "futex_do_wait", "futex"),
                      {pid: BACKWARD}, {pid: later})


def test_ddp_ranks_still_in_backward_wait_in_its_gradient_reduction():
    """DDP reduces gradients from hooks inside backward: without native frames the waiting ranks show only
    the autograd engine's frame, still across both dumps, and the rank reading the share holds them."""
    d = run_diagnosis([_in_backward(0, 4118), _in_backward(1, 4119), _reading(2, 4121), _in_backward(3, 4122)],
                      "py-spy")
    assert d["verdict"] == "rank_holds_collective" and d["waiting_ranks"] == [0, 1, 3]
    assert d["holder"]["rank"] == 2 and "backward" in d["collective"]
    moving = run_diagnosis([_in_backward(0, 4118, moved=True), _reading(1, 4119)], "py-spy")
    assert moving["verdict"] == "blocked_io"  # a backward that moved between the dumps is computing
