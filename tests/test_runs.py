"""Training runs found from real processes: a launcher and its ranks, their progress marks from /proc, and
how a run ended."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from trainguard.records import GpuProcess, GpuSample, MountKind
from trainguard.sources.run_end import ending, error_line, how_ended, local_paths
from trainguard.sources.runs import RunSampler, launcher_kind, parse_stat

from tests.support.daemon_proc import wait_until
from tests.support.launcher import has_ended, launch


@pytest.fixture
def launched(tmp_path):
    with launch(tmp_path) as running:
        yield running


def on_gpu(pid: int, index: int = 0) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", "A100", 0.0, util_ratio=1.0,
                     processes=(GpuProcess(host_pid=pid, pid=pid, used_memory_bytes=1 << 30),))


def test_the_ranks_of_a_launcher_are_one_run_even_those_without_a_gpu(launched):
    launcher, (r0, r1), out = launched
    runs, ended = RunSampler().sample(0.0, [on_gpu(r0)])
    [run] = runs
    assert run.name == f"torchrun-{launcher.pid}" and ended == ()
    start = parse_stat(Path(f"/proc/{launcher.pid}/stat").read_text()).start
    assert run.run_id == f"{launcher.pid}@{start}"  # the same after a daemon restart
    by_pid = {r.pid: r for r in run.ranks}
    assert set(by_pid) == {r0, r1}
    assert (by_pid[r0].rank, by_pid[r0].gpus, by_pid[r1].rank, by_pid[r1].gpus) == (0, (0,), 1, ())
    assert by_pid[r0].outputs == (str(out / "rank0.log"),)


def test_a_rank_that_writes_moves_its_mark_and_a_waiting_one_does_not(launched):
    _launcher, (r0, r1), out = launched
    sampler = RunSampler()
    before = {r.pid: r.mark for r in sampler.sample(0.0, [on_gpu(r0)])[0][0].ranks}
    size = (out / "rank0.log").stat().st_size
    os.kill(r0, signal.SIGUSR1)
    wait_until(lambda: (out / "rank0.log").stat().st_size > size, 20, what="the step line")
    after = {r.pid: r.mark for r in sampler.sample(1.0, [on_gpu(r0)])[0][0].ranks}
    assert after[r0] > before[r0]
    assert after[r1] == before[r1]


def test_a_run_that_crashed_ends_with_its_error_line_and_a_clean_end_with_none(launched):
    _launcher, (r0, r1), _out = launched
    sampler = RunSampler()
    [run] = sampler.sample(0.0, [on_gpu(r0)])[0]
    os.kill(r1, signal.SIGTERM)  # one rank killed: the run goes on
    os.kill(r0, signal.SIGUSR2)
    wait_until(lambda: has_ended(r0), 20, what="rank 0's crash")
    runs, ended = sampler.sample(10.0, [])
    assert runs == ()
    [end] = ended
    assert end.run_id == run.run_id and end.error == "RuntimeError: boom"
    assert sampler.sample(10.0 + 3601, [])[1] == ()  # reported for an hour, then dropped


def test_an_output_on_a_share_is_not_read_after_the_run_ended():
    local = local_paths([("/", MountKind.LOCAL), ("/root/autodl-fs", MountKind.FUSE)])
    assert local("/root/autodl-tmp/x.log") and not local("/root/autodl-fs/run/x.log")
    assert local("/root/autodl-fsx/y.log")


@pytest.mark.parametrize(("cmdline", "kind"), [
    (("/usr/bin/torchrun", "--nproc-per-node=4", "train.py"), "torchrun"),
    (("/usr/bin/python3", "-m", "torch.distributed.run", "train.py"), "torchrun"),
    (("/usr/bin/python3", "/opt/venv/bin/accelerate", "launch", "train.py"), "accelerate"),
    (("mpirun", "-np", "8", "python", "train.py"), "mpirun"),
    (("/usr/bin/python3", "train.py", "--out", "torchrun"), None),
    (("/usr/bin/python3", "train.py"), None),
])
def test_launchers_are_named_from_their_command_line(cmdline, kind):
    assert launcher_kind(cmdline) == kind


def test_the_error_line_of_an_output_tail():
    tail = ("step 99\nTraceback (most recent call last):\n  File \"train.py\", line 3\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \ntrain.py FAILED\n")
    assert error_line(tail).startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
    assert error_line("RuntimeError: loss is nan at step 7\n" + tail) == "RuntimeError: loss is nan at step 7"
    assert error_line("step 1\nstep 2\nerror_file: <N/A>\ndone\n") == ""
    ranks = ("[rank0]: RuntimeError: loss is nan at step 7\n[rank3]: RuntimeError: Connection closed by peer\n"
             "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n")
    assert error_line(ranks) == "[rank0]: RuntimeError: loss is nan at step 7"


TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : {other} (pid: 125)
  traceback : {other_tb}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 123)
  error_file: <N/A>
  traceback : {tb}
============================================================
"""
KILLED_TB = "Signal 9 (SIGKILL) received by PID 123"


@pytest.mark.parametrize(("tail", "how", "line"), [
    ("step 1\nstep 2\ndone\n", "finished", ""),
    ("step 1\nKilled 3 stale workers\n" + "step\n" * 6, "finished", ""),  # a word in the log, long before its end
    ("step 1\nRuntimeError: loss is nan at step 7\n", "error", "RuntimeError: loss is nan at step 7"),
    ("step 1\n./run.sh: line 3: 4121 Killed                  python train.py\n", "killed",
     "./run.sh: line 3: 4121 Killed                  python train.py"),
    # rank 0 was killed first; rank 1's error followed it: killed, said by the root cause's line
    ("[rank1]: RuntimeError: Connection closed by peer\n" + TORCHRUN_REPORT.format(
        other=1, other_tb="To enable traceback see: ...", code=-9, tb=KILLED_TB), "killed", "traceback : " + KILLED_TB),
    # rank 0 raised first; another rank was then ended by torchrun's SIGTERM: an error, rank 0's
    ("[rank0]: RuntimeError: loss is nan\n" + TORCHRUN_REPORT.format(
        other=-15, other_tb="Signal 15 (SIGTERM) received by PID 125", code=1, tb="To enable traceback see: ..."),
     "error", "[rank0]: RuntimeError: loss is nan"),
])
def test_how_a_run_ended_from_its_output_tail(tail, how, line):
    assert how_ended(tail) == (how, line)


def test_how_a_run_ended_is_unknown_without_output_and_read_only_on_local_disk(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1\nRuntimeError: boom\n")
    assert ending([str(log)], lambda _p: True) == ("error", "RuntimeError: boom")
    assert ending([str(log)], lambda _p: False) == ("unknown", "")  # on a share: not read
    assert ending([str(tmp_path / "gone.log")], lambda _p: True) == ("unknown", "")
    (tmp_path / "empty.log").write_text("")
    assert ending([str(tmp_path / "empty.log")], lambda _p: True) == ("finished", "")
