"""A real 4-rank torch.distributed job (gloo, CPU) under torchrun hangs; the daemon's progress watchdog
says so once, naming the run and the rank that blocks.

The job (gloo_trainer.py) really trains and really hangs: rank 2 reads its batches from a FUSE share
(tests/support/slowfs) that stops answering, and ranks 0, 1, 3 wait for it in the gradients' all_reduce;
a data-loader worker waits for a lock forever; a single process sits in D state writing a checkpoint to
the share. And it really does what must raise nothing: a slow start-up, an evaluation pass, a 5-minute
checkpoint save while the other ranks spin, a daemon restart, a crash (train.exit, not a hang).
The daemon runs in this process on a fake clock with fake NVML at its boundary (each rank on a GPU,
computing at 300 W, then 100 % busy at 75 W: the spin of a collective that never completes): the
minutes of silence are stepped over, the hang is not.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainguard import config as configmod
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import AlertStatus
from trainguard.service.daemon import Daemon

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support import fake_daemon
from tests.support.daemon_proc import child_env, wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.timeout(240)]

TRAINER = Path(__file__).resolve().parent / "gloo_trainer.py"
RANKS = 4
INTERVAL = 10.0
MIN_SILENCE = 60.0


class Recorder(fake_daemon.Recorder):
    def of(self, prefix: str, status: AlertStatus = AlertStatus.FIRING):
        return [e for e in self.events if e.status is status and e.finding.key.startswith(prefix)]


class GlooJob:
    """torchrun and its ranks (or one process with single=True), started here and ended here by PID."""

    def __init__(self, workdir: Path, *extra: str, single: bool = False) -> None:
        self.out = workdir / "run"
        self.out.mkdir()
        self.log = workdir / "train.log"  # the launcher's stdout, a file on local disk
        self.nranks = 1 if single else RANKS
        launcher = [] if single else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
        argv = [sys.executable, *launcher, str(TRAINER), "--out", str(self.out), *extra]
        if single:
            argv.append("--single")
        env = child_env({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
        with open(self.log, "wb") as log:
            # A session of its own: the ranks torchrun starts share its process group, which stop() ends
            # whole, also when the ranks never came up (their PIDs unknown).
            self.launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=env, start_new_session=True)
        self.pids: list[int] = []
        try:
            self.pids = wait_until(self._pids, 120, what=f"{self.nranks} ranks up")
        except BaseException:
            self.stop()
            raise

    def _pids(self) -> list[int] | None:
        files = [self.out / f"rank{r}.pid" for r in range(self.nranks)]
        return [int(f.read_text()) for f in files] if all(f.exists() and f.read_text() for f in files) else None

    def steps(self) -> int:
        return self.log.read_text(errors="replace").count("step ")

    def stop(self) -> None:
        for pid in [*self.pids, self.launcher.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.launcher.pid, signal.SIGKILL)  # the group this job's launcher leads: ours alone
        except ProcessLookupError:
            pass
        self.launcher.wait()


def nvml_for(pids: list[int], clock: FakeClock, phases: list[dict]):
    """Each rank on its own GPU through `phases` ({"at": s since now, util, power_w, mem_used})."""
    gpus = []
    for pid in pids:
        procs = [{"pid": pid, "used": 20 * GiB}]
        gpus.append(gpu_spec([{"mem_used": 20 * GiB, **phase, "processes": procs} for phase in phases]))
    return fake_pynvml.FakeNvml({"gpus": gpus, "t0": clock.now}, clock=clock)


TRAINING = {"util": 95, "power_w": 300}


def daemon_config(tmp_path: Path, enabled: bool = True, py_spy: bool = False) -> configmod.Loaded:
    return configmod.Loaded(configmod.parse({
        "general": {"interval": f"{INTERVAL}s"}, "filesystems": {"exclude": ["*"], "paths": [str(tmp_path)]},
        "gpu": {"host_pid_namespace": "yes", "py_spy": py_spy},
        "alerts": {"keep_firing_for": "0s"},
        "progress": {"enabled": enabled, "min_silence": f"{MIN_SILENCE}s"},
    }, "test"), "test")


class Watch:
    """The daemon on a fake clock, stepped one interval per cycle; its alerts recorded."""

    def __init__(self, tmp_path: Path, nvml, clock: FakeClock, py_spy: bool = False) -> None:
        self.tmp_path, self.nvml, self.clock, self.notes = tmp_path, nvml, clock, Recorder()
        self.py_spy = py_spy
        self.daemon = self.start()
        self.daemon.cycle()

    def start(self) -> Daemon:
        return Daemon(daemon_config(self.tmp_path, ENABLED, self.py_spy), clock=self.clock, state_dir=str(self.tmp_path / "state"),
                      notifiers=[self.notes], nvml=self.nvml)

    def restart(self) -> None:
        self.daemon.close()
        self.daemon = self.start()

    def cycle(self) -> None:
        self.clock.advance(INTERVAL)
        self.daemon.cycle()

    def train(self, job: GlooJob, cycles: int) -> None:
        """Real steps between the cycles: each cycle waits for one."""
        for _ in range(cycles):
            seen = job.steps()
            wait_until(lambda seen=seen: job.steps() > seen, 60, what="a training step")
            self.cycle()

    def until_hang(self, cycles: int) -> float | None:
        for _ in range(cycles):
            self.cycle()
            if self.notes.of("train.hang:"):
                return self.clock.now
        return None

    def diagnosed(self) -> dict:
        """The hang's details once the cross-rank diagnosis is in (cycling on: a late one comes as an update)."""
        def found() -> dict | None:
            done = [e.finding.details for e in self.notes.of("train.hang:") if e.finding.details.get("verdict")]
            if not done:
                self.cycle()
            return done[-1] if done else None

        return wait_until(found, 60, what="the rank diagnosis")

    def close(self) -> None:
        self.daemon.close()


ENABLED = True  # the feature switch these tests were checked with off (each hang test then fails)
TRAIN_CYCLES = 8
HUNG_AT = TRAIN_CYCLES * INTERVAL + 1  # the fake GPUs change phase here (s of the daemon's clock)


def assert_one_hang(watch: Watch, job: GlooJob, fired: float | None, evidence: str) -> dict:
    assert fired is not None, "no train.hang within the timeout + 2 intervals"
    [event] = watch.notes.of("train.hang:")
    d = event.finding.details
    assert fired - d["last_progress_ts"] <= d["timeout_s"] + 2 * INTERVAL
    assert d["gpu_evidence"] == evidence
    assert sorted(r["pid"] for r in d["ranks"]) == sorted(job.pids)
    return d


@pytest.fixture
def share_data(slowfs) -> Path:
    data = Path(slowfs.backing_dir) / "data.bin"
    with open(data, "wb") as fh:
        fh.truncate((1 << 30) + 4096)  # sparse: a new MiB each step costs no disk
    return Path(slowfs.mountpoint) / "data.bin"


def test_a_rank_blocked_on_a_hung_share_is_one_train_hang_naming_it(tmp_path, slowfs, share_data):
    job = GlooJob(tmp_path, "--share-data", str(share_data), "--share-rank", "2")
    clock = FakeClock()
    watch = Watch(tmp_path, nvml_for(job.pids, clock, [{"at": 0, **TRAINING},
                                                        {"at": HUNG_AT, "util": 100, "power_w": 75}]), clock,
                  py_spy=shutil.which("py-spy") is not None)
    try:
        watch.train(job, TRAIN_CYCLES)
        assert watch.notes.of("train.") == []
        slowfs.block("read")
        slowfs.wait_blocked("read", timeout=30)  # rank 2 sits in the kernel; the others wait in all_reduce
        last = job.steps()
        fired = watch.until_hang(int(MIN_SILENCE / INTERVAL) + 3)
        assert job.steps() == last  # the job really stopped
        d = assert_one_hang(watch, job, fired, "spinning")
        assert watch.notes.of("train.hang:")[0].finding.key == f"train.hang:torchrun-{job.launcher.pid}"
        ranks = {r["rank"]: r for r in d["ranks"]}
        assert sorted(ranks) == [0, 1, 2, 3] and ranks[2]["pid"] == job.pids[2]
        assert [r for r, info in ranks.items() if info["blocked_threads"]] == [2]  # the one in I/O
        assert not watch.notes.of("gpu.stall")  # one alert per run, not one per GPU
        d = watch.diagnosed()  # the cross-rank diagnosis names the rank that holds the others
        named = d.get("holder") or d.get("blocked_rank")
        assert named["rank"] == 2 and named["pid"] == job.pids[2]
        assert str(slowfs.mountpoint) in str(named.get("file") or named.get("mount"))
        if watch.py_spy:  # with the stacks: its Python frame, and the ranks waiting in the collective
            assert d["verdict"] == "rank_holds_collective" and named["frame"] and d["waiting_ranks"] == [0, 1, 3]
        for lang in ("en", "zh"):  # and the phone message says so, in both languages
            texts = texts_for(watch.notes.of("train.hang:")[-1].finding, tr(lang))
            assert not texts.fallback and f"PID {job.pids[2]}" in texts.why and str(slowfs.mountpoint) in texts.why
        slowfs.unblock("read")
        wait_until(lambda: job.steps() > last, 60, what="training to resume")
        watch.cycle()
        assert watch.notes.of("train.hang:", AlertStatus.RESOLVED)
    finally:
        slowfs.unblock("all")
        watch.close()
        job.stop()


def test_a_deadlocked_data_loader_worker_on_a_small_model_is_caught(tmp_path):
    lock = tmp_path / "loader.lock"
    lock.write_bytes(b"")
    job = GlooJob(tmp_path, "--loader-rank", "1", "--loader-lock", str(lock))
    clock = FakeClock()
    # VRAM 30 %, far from the stall's 80 %: only the watchdog can see this one.
    watch = Watch(tmp_path, nvml_for(job.pids, clock, [{"at": 0, **TRAINING, "mem_used": 24 * GiB},
                                                        {"at": HUNG_AT, "util": 0, "power_w": 60}]), clock)
    try:
        watch.train(job, TRAIN_CYCLES)
        with open(lock, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # the worker's next batch waits for it forever
            wait_until(lambda: _stopped(job), 30, what="the job to stop")
            fired = watch.until_hang(int(MIN_SILENCE / INTERVAL) + 3)
            assert_one_hang(watch, job, fired, "idle")
            assert not watch.notes.of("gpu.stall")
    finally:
        watch.close()
        job.stop()


def _stopped(job: GlooJob, quiet: float = 1.0) -> bool:
    """No new step line for `quiet` s (the step loop runs every 50 ms)."""
    before = job.steps()
    time.sleep(quiet)
    return job.steps() == before


def test_a_single_process_in_d_state_on_a_checkpoint_write_is_caught_whatever_the_gpu_shows(tmp_path, slowfs):
    job = GlooJob(tmp_path, "--ckpt-dir", str(slowfs.mountpoint), "--ckpt-every", "3", single=True)
    clock = FakeClock()
    busy = {"util": 60, "power_w": 250}  # neither idle nor a spin: the GPU alone would not call it
    watch = Watch(tmp_path, nvml_for(job.pids, clock, [{"at": 0, **TRAINING}, {"at": HUNG_AT, **busy}]), clock)
    try:
        watch.train(job, TRAIN_CYCLES)
        slowfs.block("write")
        slowfs.wait_blocked("write", timeout=30)
        fired = watch.until_hang(int(MIN_SILENCE / INTERVAL) + 3)
        d = assert_one_hang(watch, job, fired, "blocked")
        assert d["ranks"][0]["main_blocked"]
    finally:
        slowfs.unblock("all")
        watch.close()
        job.stop()


def test_start_up_evaluation_save_restart_and_a_crash_raise_no_hang(tmp_path):
    start, evaluate, crash, save = (tmp_path / name for name in ("start", "eval", "crash", "save"))
    checkpoint = tmp_path / "run-ckpt.pt"
    job = GlooJob(tmp_path, "--start-file", str(start), "--eval-file", str(evaluate), "--crash-file", str(crash),
                  "--save-file", str(save), "--save-to", str(checkpoint))
    clock = FakeClock()
    startup = 60  # cycles: 10 minutes before step 1, GPUs idle, within the 30-minute start-up grace
    save_at = (startup + TRAIN_CYCLES + 2 + 10 + 2) * INTERVAL  # the daemon's clock when the save starts
    # During the 5-minute save the other ranks wait in all_reduce: their GPUs spin as in a real hang.
    watch = Watch(tmp_path, nvml_for(job.pids, clock, [
        {"at": 0, "util": 0, "power_w": 60}, {"at": startup * INTERVAL + 1, **TRAINING},
        {"at": save_at + 1, "util": 100, "power_w": 75}, {"at": save_at + 30 * INTERVAL + 1, **TRAINING}]), clock)
    try:
        for _ in range(startup):
            watch.cycle()
        start.write_text("")
        watch.train(job, TRAIN_CYCLES)
        watch.restart()  # the daemon restarted in the middle of the run: the cadence is read back
        [cadence] = watch.daemon.progress.cadences.values()
        assert cadence.last_progress is not None and cadence.gaps
        watch.train(job, 2)
        evaluate.write_text("")  # an evaluation 10 steps long, at training power, logging nothing
        wait_until(lambda: _stopped(job), 30, what="the evaluation to start")
        for _ in range(10):
            watch.cycle()
        evaluate.unlink()
        watch.train(job, 2)
        assert clock.now - watch.nvml.t0 == save_at
        save.write_text("")
        for _ in range(30):  # a 5-minute save: each cycle sees the checkpoint grow
            size = checkpoint.stat().st_size if checkpoint.exists() else 0
            wait_until(lambda size=size: checkpoint.exists() and checkpoint.stat().st_size > size, 30,
                       what="the checkpoint to grow")
            watch.cycle()
        save.unlink()
        watch.train(job, 2)
        crash.write_text("")  # rank 0 raises; torchrun ends the others and exits
        assert job.launcher.wait(timeout=60) != 0
        watch.cycle()
        watch.cycle()
        assert watch.notes.of("train.hang:") == []
        [ended] = watch.notes.of("train.exit:")
        assert ended.finding.key == f"train.exit:torchrun-{job.launcher.pid}"
        assert "RuntimeError: loss is nan" in ended.finding.details["error"]
    finally:
        watch.close()
        job.stop()
