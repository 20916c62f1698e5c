"""A real 4-rank torch.distributed job (gloo, CPU) under torchrun hangs; the daemon's progress watchdog
says so once, naming the run and the rank that blocks.

The job (gloo_trainer.py) really trains and really hangs: rank 2 reads its batches from a FUSE share
(tests/support/slowfs) that stops answering, and ranks 0, 1, 3 wait for it in the gradients' all_reduce.
The daemon runs in this process on a fake clock with fake NVML at its boundary (each rank on a GPU,
computing at 300 W, then 100 % busy at 75 W: the spin of a collective that never completes): the
minutes of silence are stepped over, the hang is not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard import config as configmod
from trainguard.records import AlertStatus
from trainguard.service.daemon import Daemon

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support.daemon_proc import child_env, wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.timeout(240)]

TRAINER = Path(__file__).resolve().parent / "gloo_trainer.py"
RANKS = 4
INTERVAL = 10.0
MIN_SILENCE = 60.0


class Recorder:
    def __init__(self) -> None:
        self.events = []

    def notify(self, events) -> None:
        self.events.extend(events)

    def close(self) -> None:
        pass

    def of(self, prefix: str, status: AlertStatus = AlertStatus.FIRING):
        return [e for e in self.events if e.status is status and e.finding.key.startswith(prefix)]


class GlooJob:
    """torchrun and its ranks, started here and ended here by PID."""

    def __init__(self, workdir: Path, share_data: Path) -> None:
        self.out = workdir / "run"
        self.out.mkdir()
        self.log = workdir / "train.log"  # the launcher's stdout, a file on local disk
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
                str(TRAINER), "--out", str(self.out), "--share-data", str(share_data), "--share-rank", "2"]
        env = child_env({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
        with open(self.log, "wb") as log:
            self.launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=env)
        self.pids = wait_until(self._pids, 120, what="4 ranks up")

    def _pids(self) -> list[int] | None:
        files = [self.out / f"rank{r}.pid" for r in range(RANKS)]
        return [int(f.read_text()) for f in files] if all(f.exists() and f.read_text() for f in files) else None

    def steps(self) -> int:
        return self.log.read_text(errors="replace").count("step ")

    def stop(self) -> None:
        for pid in [*self.pids, self.launcher.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.launcher.wait()


def nvml_for(pids: list[int], clock: FakeClock, hang_at: float):
    gpus = []
    for pid in pids:
        procs = [{"pid": pid, "used": 20 * GiB}]
        gpus.append(gpu_spec([{"at": 0, "util": 95, "power_w": 300, "mem_used": 20 * GiB, "processes": procs},
                              {"at": hang_at, "util": 100, "power_w": 75, "processes": procs}]))
    return fake_pynvml.FakeNvml({"gpus": gpus, "t0": clock.now}, clock=clock)


def daemon_config(tmp_path: Path, enabled: bool = True) -> configmod.Loaded:
    return configmod.Loaded(configmod.parse({
        "general": {"interval": f"{INTERVAL}s"}, "filesystems": {"exclude": ["*"], "paths": [str(tmp_path)]},
        "gpu": {"host_pid_namespace": "yes", "py_spy": False},
        "alerts": {"keep_firing_for": "0s"},
        "progress": {"enabled": enabled, "min_silence": f"{MIN_SILENCE}s", "startup_grace": "5m"},
    }, "test"), "test")


@pytest.fixture
def share_data(slowfs) -> Path:
    data = Path(slowfs.backing_dir) / "data.bin"
    with open(data, "wb") as fh:
        fh.truncate((1 << 30) + 4096)  # sparse: a new MiB each step costs no disk
    return Path(slowfs.mountpoint) / "data.bin"


def test_a_rank_blocked_on_a_hung_share_is_one_train_hang_naming_it(tmp_path, slowfs, share_data):
    job = GlooJob(tmp_path, share_data)
    clock, notes = FakeClock(), Recorder()
    train_cycles = 8
    daemon = Daemon(daemon_config(tmp_path), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[notes],
                    nvml=nvml_for(job.pids, clock, hang_at=train_cycles * INTERVAL + 1))
    try:
        daemon.cycle()
        for _ in range(train_cycles):  # real steps between the cycles, each cycle 10 s of the daemon's clock
            seen = job.steps()
            wait_until(lambda seen=seen: job.steps() > seen, 60, what="a training step")
            clock.advance(INTERVAL)
            daemon.cycle()
        assert notes.of("train.") == []
        slowfs.block("read")
        slowfs.wait_blocked("read", timeout=30)  # rank 2 sits in the kernel; the others wait in all_reduce
        last = job.steps()
        fired = None
        for _ in range(int(MIN_SILENCE / INTERVAL) + 3):
            clock.advance(INTERVAL)
            daemon.cycle()
            if notes.of("train.hang:"):
                fired = clock.now
                break
        assert job.steps() == last  # the job really stopped
        assert fired is not None, "no train.hang within the timeout + 2 intervals"
        [event] = notes.of("train.hang:")
        d = event.finding.details
        assert event.finding.key == f"train.hang:torchrun-{job.launcher.pid}"
        assert fired - d["last_progress_ts"] <= d["timeout_s"] + 2 * INTERVAL
        assert d["gpu_evidence"] == "spinning"
        ranks = {r["rank"]: r for r in d["ranks"]}
        assert sorted(ranks) == [0, 1, 2, 3] and ranks[2]["pid"] == job.pids[2]
        assert [r for r, info in ranks.items() if info["blocked_threads"]] == [2]  # the one in I/O
        assert not notes.of("gpu.stall")  # one alert per run, not one per GPU
        holder = d.get("holder")
        if holder is not None:  # the cross-rank diagnosis (diagnosis/), where it is built, names the frame
            assert holder["rank"] == 2 and holder["pid"] == job.pids[2]
            assert str(slowfs.mountpoint) in str(holder.get("file") or holder.get("mount"))
        slowfs.unblock("read")
        wait_until(lambda: job.steps() > last, 60, what="training to resume")
        clock.advance(INTERVAL)
        daemon.cycle()
        assert notes.of("train.hang:", AlertStatus.RESOLVED)
    finally:
        slowfs.unblock("all")
        daemon.close()
        job.stop()
