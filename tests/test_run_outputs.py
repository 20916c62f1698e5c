"""A run's output as its progress, with real processes: stdout piped into a real `tee` writing a file on
local disk, and a log appended to by open/append/close per step (never seen open) that [[logs]] follows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from trainguard import config as configmod
from trainguard.records import GpuProcess, GpuSample
from trainguard.service.daemon import Daemon
from trainguard.sources.pipes import PipeReaders
from trainguard.sources.runs import RunSampler

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support import fake_daemon
from tests.support.daemon_proc import wait_until

PRINTS = textwrap.dedent("""
    import signal
    def crash(*_):
        raise RuntimeError("boom")
    signal.signal(signal.SIGUSR1, lambda *_: print("step", flush=True))
    signal.signal(signal.SIGUSR2, crash)
    print("ready", flush=True)
    while True:
        signal.pause()
""")
APPENDS = textwrap.dedent("""
    import signal
    def step(*_):
        with open("train.log", "a") as fh:  # opened, appended to and closed per line
            fh.write("step\\n")
    signal.signal(signal.SIGUSR1, step)
    step()
    while True:
        signal.pause()
""")


def on_gpu(pid: int) -> GpuSample:
    return GpuSample(0, "GPU-0", "A100", 0.0, util_ratio=1.0,
                     processes=(GpuProcess(host_pid=pid, pid=pid, used_memory_bytes=1 << 30),))


@pytest.fixture
def piped(tmp_path):
    """A rank whose stdout and stderr are a pipe into `tee train.log` (the file on local disk, tee's own stdout nowhere)."""
    log = tmp_path / "train.log"
    rank = subprocess.Popen([sys.executable, "-c", PRINTS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "RANK": "0"})
    tee = subprocess.Popen(["tee", str(log)], stdin=rank.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rank.stdout.close()  # the pipe's one reader is tee
    try:
        wait_until(lambda: log.exists() and "ready" in log.read_text(), 20, what="the rank's first line")
        yield rank, tee, log
    finally:
        for proc in (rank, tee):
            proc.kill()
            proc.wait()


def print_step(pid: int, log: Path) -> None:
    """The process prints one step line, and all of it is in the file (a pipe may pass it in pieces)."""
    lines = log.read_text().count("step\n")
    os.kill(pid, signal.SIGUSR1)
    wait_until(lambda: log.read_text().count("step\n") > lines, 20, what="the step line in the file")


def mark_of(sampler: RunSampler, now: float, pid: int):
    [run] = sampler.sample(now, [on_gpu(pid)])[0]
    [rank] = run.ranks
    return rank


def test_output_piped_into_tee_is_progress_and_its_stop_is_silence(piped):
    rank, _tee, log = piped
    sampler = RunSampler()
    first = mark_of(sampler, 0.0, rank.pid)
    assert first.outputs == (str(log),)  # a crash is read from the file tee writes
    print_step(rank.pid, log)
    stepped = mark_of(sampler, 10.0, rank.pid)
    assert stepped.mark > first.mark  # the line it printed, through the pipe, is progress
    print_step(rank.pid, log)
    again = mark_of(sampler, 20.0, rank.pid)
    assert again.mark > stepped.mark
    assert mark_of(sampler, 30.0, rank.pid).mark == again.mark  # it stopped printing: silence
    assert mark_of(sampler, 40.0, rank.pid).mark == again.mark


def test_the_pipe_reader_is_found_once_and_again_only_when_it_is_gone(piped, monkeypatch):
    rank, tee, _log = piped
    finds = []
    original = PipeReaders._find
    monkeypatch.setattr(PipeReaders, "_find", lambda self, inode, writer: finds.append(inode) or original(
        self, inode, writer))
    sampler = RunSampler()
    for now in range(5):
        mark_of(sampler, float(now), rank.pid)
    assert len(finds) == 1  # not a /proc pass each cycle
    [(_inode, (reader, _when))] = sampler.pipes._readers.items()
    assert reader[0] == tee.pid


LAUNCHER = textwrap.dedent("""\
    #!{python}
    import signal, subprocess, sys
    # one rank that writes nothing; the launcher prints what it hears from it (torchrun --tee)
    rank = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], stdout=subprocess.DEVNULL,
                            env={{"RANK": "0"}})
    signal.signal(signal.SIGUSR1, lambda *_: print("[default0]: step", flush=True))
    print("rank", rank.pid, flush=True)
    rank.wait()
""")


def test_the_launchers_output_piped_into_tee_is_the_runs_progress(tmp_path):
    script = tmp_path / "torchrun"
    script.write_text(LAUNCHER.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "train.log"
    launcher = subprocess.Popen([str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    tee = subprocess.Popen(["tee", str(log)], stdin=launcher.stdout, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    launcher.stdout.close()
    rank = 0
    try:
        wait_until(lambda: log.exists() and "rank" in log.read_text(), 20, what="the launcher's first line")
        rank = int(log.read_text().split()[1])
        sampler = RunSampler()
        first = mark_of(sampler, 0.0, rank)
        print_step(launcher.pid, log)
        assert mark_of(sampler, 10.0, rank).mark > first.mark
        assert str(log) in mark_of(sampler, 20.0, rank).outputs
    finally:
        for pid in (rank, launcher.pid, tee.pid):
            if pid:
                os.kill(pid, signal.SIGKILL)
        launcher.wait()
        tee.wait()


def test_a_crash_printed_through_the_pipe_is_read_from_the_file_tee_writes(piped):
    rank, tee, _log = piped
    sampler = RunSampler()
    [run] = sampler.sample(0.0, [on_gpu(rank.pid)])[0]
    os.kill(rank.pid, signal.SIGUSR2)
    rank.wait(timeout=20)
    tee.wait(timeout=20)  # the pipe closed: tee wrote everything and left
    runs, [end] = sampler.sample(10.0, [])
    assert runs == () and end.run_id == run.run_id
    assert (end.how, end.error) == ("error", "RuntimeError: boom")


HOLDS = textwrap.dedent("""
    import sys
    fh = open(sys.argv[1], "a")  # kept open until told, then reopened per line
    print("open", flush=True)
    sys.stdin.readline()
    fh.close()
    print("closed", flush=True)
    sys.stdin.readline()
""")


def test_a_watched_log_the_run_was_seen_writing_is_its_own_after_it_is_closed(tmp_path):
    seen, other = tmp_path / "logs" / "seen.log", tmp_path / "logs" / "other.log"
    seen.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLDS, str(seen)], cwd="/", stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, env={**os.environ, "RANK": "0"})
    try:
        assert proc.stdout.readline() == "open\n"
        sampler = RunSampler()
        [run] = sampler.sample(0.0, [on_gpu(proc.pid)], logs={str(seen): 0.0, str(other): 0.0})[0]
        proc.stdin.write("close\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "closed\n"
        grown = {str(seen): 5.0, str(other): 7.0}  # the log watcher's word: both grew
        [run] = sampler.sample(10.0, [on_gpu(proc.pid)], logs=grown)[0]
        assert run.ranks[0].grew_at == 5.0  # its own log, though closed now; not another's in no cwd of it
    finally:
        proc.kill()
        proc.wait()


def config(tmp_path: Path, workdir: Path) -> configmod.Loaded:
    return configmod.Loaded(configmod.parse({
        "general": {"interval": "10s"}, "filesystems": {"exclude": ["*"], "paths": [str(tmp_path)]},
        "gpu": {"host_pid_namespace": "yes", "py_spy": False},
        "progress": {"min_silence": "1m", "factor": 3, "startup_grace": "5m"},
        "logs": [{"paths": [str(workdir / "*.log")], "observer": "polling"}],
    }, "test"), "test")


def test_a_watched_log_appended_per_line_in_the_runs_working_directory_is_progress(tmp_path):
    # On tmpfs a write never moves the writer's write_bytes: the log's growth is the only sign.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        workdir = Path(shm)
        log = workdir / "train.log"
        proc = subprocess.Popen([sys.executable, "-c", APPENDS], cwd=workdir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, env={**os.environ, "RANK": "0"})
        clock = FakeClock()
        procs = [{"pid": proc.pid, "used": 20 * GiB}]
        nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "power_w": 60, "mem_used": 20 * GiB,
                                                         "processes": procs}])], "t0": clock.now}, clock=clock)
        daemon = Daemon(config(tmp_path, workdir), clock=clock, state_dir=str(tmp_path / "state"),
                        notifiers=[fake_daemon.Recorder()], nvml=nvml)
        try:
            wait_until(lambda: log.exists() and log.read_text(), 20, what="the first line")
            daemon.samplers.logs.poll()
            daemon.cycle()
            for _ in range(3):
                size = log.stat().st_size
                os.kill(proc.pid, signal.SIGUSR1)
                wait_until(lambda size=size: log.stat().st_size > size, 20, what="the appended line")
                clock.advance(10.0)
                daemon.samplers.logs.poll()
                daemon.cycle()
                [c] = daemon.progress.cadences.values()
                assert c.last_progress == clock.now  # the appended line is this cycle's progress
            for _ in range(3):  # no more lines: silence, though the process lives
                clock.advance(10.0)
                daemon.samplers.logs.poll()
                daemon.cycle()
            [c] = daemon.progress.cadences.values()
            assert clock.now - c.last_progress == 30.0
        finally:
            daemon.close()
            proc.kill()
            proc.wait()
