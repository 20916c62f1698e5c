"""A hang across ranks on real processes: ranks that wait in a function `all_reduce` of a module under
torch/distributed/ (plain Python, fast), and one rank whose read from the hung FUSE share holds them.
The train.hang finding goes through the stall diagnoser's enrich(), whose worker reads /proc and runs
py-spy twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from trainguard.detectors.progress import HANG_PREFIX
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.diagnosis.words import run_remedy_text, run_verdict_text
from trainguard.i18n import tr
from trainguard.records import Finding, Severity, Snapshot
from trainguard.sources import procs

# The collective of the stand-in library: it waits for a peer that never answers.
C10D = textwrap.dedent("""
    import sys
    def all_reduce(tensor):
        return sys.stdin.readline()
""")
RANK = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[1])  # .../torch/distributed: the path a collective's frames have
    import c10d_standin as dist
    rank, holder, path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    class Shard:
        def __getitem__(self, i):
            with open(path, "rb") as fh:
                return fh.read(16)
    def train_step():
        batch = Shard()[0] if rank == holder else b""
        dist.all_reduce(batch)
    print("ready", flush=True)
    sys.stdin.readline()
    train_step()
""")
PY_SPY = shutil.which("py-spy")
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed (pip install '.[test]')")


def _main_thread(pid: int) -> procs.ThreadInfo | None:
    return next((t for t in procs.read_threads("/proc", pid) if t.tid == pid), None)


def _main_in(pid: int, syscall: str = "", wchan: str = "") -> bool:
    """Is the main thread asleep in this syscall, or in a wait channel starting with this name?"""
    t = _main_thread(pid)
    return t is not None and t.state == "S" and (t.syscall == syscall if syscall else t.wchan.startswith(wchan))


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start_ranks(tmp_path, count: int, holder: int, path: str) -> list[subprocess.Popen]:
    lib = tmp_path / "lib" / "torch" / "distributed"
    lib.mkdir(parents=True)
    (lib / "c10d_standin.py").write_text(C10D)
    script = tmp_path / "train.py"
    script.write_text(RANK)
    ranks = [subprocess.Popen([sys.executable, str(script), str(lib), str(r), str(holder), path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(count)]
    for child in ranks:
        assert child.stdout.readline() == "ready\n"
    return ranks


def _go(ranks: list[subprocess.Popen], waiting: list[int]) -> None:
    """Start each rank's step; the waiting ones are read()ing stdin inside all_reduce when this returns."""
    for child in ranks:
        child.stdin.write("go\n")
        child.stdin.flush()
    for r in waiting:
        _wait_for(lambda pid=ranks[r].pid: _main_in(pid, syscall="read"), f"rank {r} in all_reduce")


def _stop(ranks: list[subprocess.Popen]) -> None:
    for child in ranks:
        child.kill()
    for child in ranks:
        child.wait(timeout=10)


def _hang(ranks: list[subprocess.Popen]) -> Finding:
    return Finding(f"{HANG_PREFIX}job-7", Severity.CRITICAL, "run job-7 stopped making progress",
                   details={"ranks": [{"rank": r, "pid": c.pid} for r, c in enumerate(ranks)]})


def _enriched(finding: Finding, **kwargs) -> Finding:
    diagnoser = StallDiagnoser(deadline=60.0, clock=lambda: 1_700_000_000.0, **kwargs)
    diagnoser.gatherer.interval = 1.0
    try:
        (out,) = diagnoser.enrich([finding], Snapshot(ts=1_700_000_000.0))
        return out
    finally:
        diagnoser.close()


@pytest.fixture
def held_by_rank_2(slowfs, tmp_path):
    """Four ranks: rank 2 reads a file on the hung share, ranks 0, 1, 3 wait in all_reduce."""
    data = slowfs.mountpoint / "data"
    data.mkdir()
    (data / "x.bin").write_bytes(b"\0" * 64)
    slowfs.block("read")
    ranks = _start_ranks(tmp_path, 4, 2, str(data / "x.bin"))
    try:
        _go(ranks, [0, 1, 3])
        slowfs.wait_blocked("read", timeout=20)
        yield ranks, data / "x.bin", slowfs
    finally:
        slowfs.unblock("all")  # first: a rank killed inside a held FUSE read would wait for the answer
        _stop(ranks)


@needs_py_spy
def test_the_rank_blocked_on_the_share_holds_the_others(held_by_rank_2):
    ranks, path, fs = held_by_rank_2
    out = _enriched(_hang(ranks))
    d = out.details
    assert d["verdict"] == "rank_holds_collective", d
    holder = d["holder"]
    assert (holder["rank"], holder["pid"]) == (2, ranks[2].pid)
    assert holder["frame"] == "Shard.__getitem__" and holder["at"].startswith("Shard.__getitem__ (train.py:")
    assert (holder["file"], holder["mount"], holder["syscall"]) == (str(path), str(fs.mountpoint), "read")
    assert d["collective"] == "all_reduce" and d["waiting_ranks"] == [0, 1, 3]
    assert [r["moved"] for r in d["diagnosis"]] == [False] * 4 and d["stacks"] == "py-spy"
    assert d["diagnosis_timed_out"] is False and "stacks_note" not in d
    stack = d["diagnosis"][0]["stack"]
    assert stack[0] == "all_reduce (c10d_standin.py:4)" and stack[1].startswith("train_step (train.py:")
    assert out.summary.startswith("run job-7 stopped making progress — rank 2 (PID ")
    assert f"reading {path} (mount {fs.mountpoint})" in out.summary
    assert out.summary.endswith("; ranks 0, 1, 3 wait in all_reduce")
    assert str(fs.mountpoint) in out.hint and "NCCL_DEBUG=WARN" in out.hint
    zh = run_verdict_text(d, tr("zh"))
    assert f"rank 2（PID {ranks[2].pid}）停在 Shard.__getitem__" in zh and zh.endswith("rank 0, 1, 3 在 all_reduce 中等它")
    assert str(fs.mountpoint) in run_remedy_text(d, tr("zh"))


def test_without_py_spy_proc_still_names_the_blocked_rank(held_by_rank_2, monkeypatch, tmp_path):
    ranks, path, fs = held_by_rank_2
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no py-spy on PATH
    d = _enriched(_hang(ranks)).details
    assert d["stacks"] == "missing" and d["stacks_note"].startswith("py-spy is not installed")
    assert d["verdict"] == "blocked_io" and d["holder"] is None
    assert (d["blocked_rank"]["rank"], d["blocked_rank"]["file"], d["blocked_rank"]["mount"]) == (
        2, str(path), str(fs.mountpoint))
    assert [r["kind"] for r in d["diagnosis"]] == ["unknown", "unknown", "io", "unknown"]
    assert "py-spy is not installed" in run_verdict_text(d, tr("en"))


@needs_py_spy
def test_all_ranks_in_the_collective_name_no_holder(tmp_path):
    ranks = _start_ranks(tmp_path, 3, -1, os.devnull)
    other = Finding("fs.usage:/data", Severity.WARNING, "disk 95 % full", details={"ranks": [{"rank": 0, "pid": 1}]})
    no_ranks = Finding(f"{HANG_PREFIX}job-8", Severity.CRITICAL, "run job-8 stopped", details={})
    try:
        _go(ranks, [0, 1, 2])
        diagnoser = StallDiagnoser(deadline=60.0, clock=lambda: 1_700_000_000.0)
        diagnoser.gatherer.interval = 1.0
        try:
            out = diagnoser.enrich([other, _hang(ranks), no_ranks], Snapshot(ts=1_700_000_000.0))
        finally:
            diagnoser.close()
    finally:
        _stop(ranks)
    assert out[0] is other and out[2] is no_ranks
    d = out[1].details
    assert d["verdict"] == "all_in_collective" and d["holder"] is None, d
    assert d["waiting_ranks"] == [0, 1, 2] and d["collective"] == "all_reduce"
    assert run_verdict_text(d, tr("en")).startswith("all 3 ranks here wait in all_reduce, none holds them")


@needs_py_spy
def test_a_late_diagnosis_goes_out_timed_out_and_is_sent_again(tmp_path):
    ranks = _start_ranks(tmp_path, 2, -1, os.devnull)
    diagnoser = StallDiagnoser(deadline=0.0, clock=lambda: 1_700_000_000.0)
    try:
        _go(ranks, [0, 1])
        hang = _hang(ranks)
        (first,) = diagnoser.enrich([hang], Snapshot(ts=1_700_000_000.0))
        assert first.details["diagnosis_timed_out"] is True and "verdict" not in first.details
        assert diagnoser.worker.latest(("ranks", hang.key)).wait(60)  # the worker finishes it meanwhile
        (second,) = diagnoser.enrich([hang], Snapshot(ts=1_700_000_000.0))
    finally:
        diagnoser.close()
        _stop(ranks)
    assert second.details["diagnosis_timed_out"] is False and second.details["verdict"] == "all_in_collective"
    assert diagnoser.take_updates() == {hang.key}


GLOO_RANK = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    rank, world, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    class Shard(Dataset):
        def __len__(self):
            return 100
        def __getitem__(self, i):
            if rank == 2 and i == 1:  # the second batch comes from the share
                with open(path, "rb") as fh:
                    return torch.frombuffer(bytearray(fh.read(16)), dtype=torch.float32)
            return torch.zeros(4)
    model = torch.nn.Linear(4, 1)
    for step, x in enumerate(DataLoader(Shard(), batch_size=1)):
        model(x).sum().backward()
        if step == 1:
            print("step", flush=True)
        for p in model.parameters():
            dist.all_reduce(p.grad)
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_py_spy
def test_real_gloo_ranks_wait_in_all_reduce_for_the_rank_reading_the_share(slowfs, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (the integration extra)")
    path = slowfs.mountpoint / "x.bin"
    path.write_bytes(b"\0" * 64)
    slowfs.block("read")
    script = tmp_path / "train_gloo.py"
    script.write_text(GLOO_RANK)
    port = _free_port()
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), "4", str(port), str(path)], stdout=subprocess.PIPE,
                              text=True) for r in range(4)]
    try:
        slowfs.wait_blocked("read", timeout=120)
        for r in (0, 1, 3):  # past step 1, then inside the next all_reduce (gloo waits on a futex)
            assert ranks[r].stdout.readline() == "step\n"
            _wait_for(lambda pid=ranks[r].pid: _main_in(pid, wchan="futex"), f"rank {r} in all_reduce")
        d = _enriched(_hang(ranks)).details
    finally:
        slowfs.unblock("all")
        _stop(ranks)
    assert d["verdict"] == "rank_holds_collective", d
    holder = d["holder"]
    assert (holder["rank"], holder["pid"], holder["frame"]) == (2, ranks[2].pid, "DataLoader.__next__")
    assert (holder["file"], holder["mount"]) == (str(path), str(slowfs.mountpoint))
    assert d["collective"] == "all_reduce" and d["waiting_ranks"] == [0, 1, 3]
    assert run_verdict_text(d, tr("en")).startswith(f"rank 2 (PID {ranks[2].pid}) is in DataLoader.__next__")


def test_a_py_spy_that_cannot_read_the_ranks_is_said(tmp_path):
    ranks = _start_ranks(tmp_path, 2, -1, os.devnull)
    try:
        _go(ranks, [0, 1])
        d = _enriched(_hang(ranks), py_spy_path="/bin/false").details  # exits 1, as py-spy denied ptrace does
    finally:
        _stop(ranks)
    assert d["stacks"] == "failed" and "ptrace" in d["stacks_note"]
    assert d["verdict"] == "unknown" and [r["kind"] for r in d["diagnosis"]] == ["unknown", "unknown"]
    assert [r["wchan"] for r in d["diagnosis"]] != ["", ""]  # what /proc shows: where each main thread sleeps
    assert "no ptrace rights" in run_verdict_text(d, tr("en")) and "ptrace" in run_verdict_text(d, tr("zh"))
