"""The progress watchdog in the daemon's cycle: real launcher and ranks (tests/test_runs.py's), fake NVML at
its boundary, the daemon's clock a fake one (the silence is not waited for, it is stepped over)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from trainguard import config as configmod
from trainguard.records import AlertStatus
from trainguard.service.daemon import Daemon
from trainguard.surfaces.exporter import ReadingsCollector
from trainguard.surfaces.status import build
from trainguard.surfaces.status_text import render_text

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support import fake_daemon
from tests.support.launcher import has_ended, launch

INTERVAL = 10.0


@pytest.fixture
def launched(tmp_path):
    with launch(tmp_path) as running:
        yield running


class Recorder(fake_daemon.Recorder):
    def firing(self, prefix: str):
        return [e for e in self.events if e.status is AlertStatus.FIRING and e.finding.key.startswith(prefix)]


def config(tmp_path: Path, enabled: bool = True) -> configmod.Loaded:
    cfg = configmod.parse({
        "general": {"interval": f"{INTERVAL}s"}, "filesystems": {"exclude": ["*"], "paths": [str(tmp_path)]},
        "gpu": {"host_pid_namespace": "yes", "py_spy": False},
        "alerts": {"keep_firing_for": "0s"},
        "progress": {"enabled": enabled, "min_silence": "1m", "factor": 3, "startup_grace": "5m"},
    }, "test")
    return configmod.Loaded(cfg, "test")


def nvml_for(pids, clock, hang_at: float, hang_state: dict):
    """Each rank on its own GPU, computing at 300 W, from `hang_at` (s since start) in `hang_state`."""
    gpus = []
    for pid in pids:
        procs = [{"pid": pid, "used": 50 * GiB}]
        gpus.append(gpu_spec([{"at": 0, "util": 95, "power_w": 300, "mem_used": 50 * GiB, "processes": procs},
                              {"at": hang_at, **hang_state, "processes": procs}]))
    return fake_pynvml.FakeNvml({"gpus": gpus, "t0": clock.now}, clock=clock)


def scrape(daemon: Daemon) -> dict:
    """(name, labels without the owner's) -> value of the run series on /metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadingsCollector(lambda: daemon.readings))
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.startswith("trainguard_run_"):
                labels = {k: v for k, v in sample.labels.items() if k in ("run", "train_job", "rank")}
                out[(sample.name, frozenset(labels.items()))] = sample.value
    return out


def step(pid: int, log: Path) -> None:
    """Rank `pid` prints one step line, and it is in the file."""
    size = log.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while log.stat().st_size == size:
        assert time.monotonic() < deadline, "the rank did not write its step"
        time.sleep(0.01)


def train(daemon: Daemon, clock: FakeClock, pid: int, log: Path, cycles: int) -> None:
    for _ in range(cycles):
        step(pid, log)
        clock.advance(INTERVAL)
        daemon.cycle()


def idle(daemon: Daemon, clock: FakeClock, cycles: int) -> None:
    for _ in range(cycles):
        clock.advance(INTERVAL)
        daemon.cycle()


def test_a_run_spinning_in_a_collective_is_one_hang_alert_naming_its_ranks_then_resolves(tmp_path, launched):
    launcher, (r0, r1), out = launched
    clock, notes = FakeClock(), Recorder()
    nvml = nvml_for([r0, r1], clock, hang_at=200, hang_state={"util": 100, "power_w": 70})
    daemon = Daemon(config(tmp_path), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[notes], nvml=nvml)
    try:
        daemon.cycle()
        train(daemon, clock, r0, out / "rank0.log", 19)  # to 190 s: steps every cycle at 300 W
        assert notes.firing("train.") == []
        idle(daemon, clock, 2)  # 210 s: the GPUs spin at 70 W from 200 s
        timeout = 60.0  # the floor: 3 x the 10 s gap is less
        fired_at = None
        for _ in range(int(timeout / INTERVAL) + 2):
            idle(daemon, clock, 1)
            if notes.firing("train.hang:"):
                fired_at = clock.now
                break
        assert fired_at is not None, "no train.hang within the timeout + 2 intervals"
        [event] = notes.firing("train.hang:")
        d = event.finding.details
        assert event.finding.key == f"train.hang:torchrun-{launcher.pid}"
        assert d["gpu_evidence"] == "spinning" and d["timeout_s"] == timeout
        assert {(r["rank"], r["pid"], r["gpu"]) for r in d["ranks"]} == {(0, r0, 0), (1, r1, 1)}
        assert fired_at - d["last_progress_ts"] <= timeout + 2 * INTERVAL
        assert not [e for e in notes.events if e.finding.key.startswith("gpu.stall")]
        series = scrape(daemon)
        name = f"torchrun-{launcher.pid}"
        for rank in ("0", "1"):
            labels = {"run": name, "train_job": name, "rank": rank}
            assert series[("trainguard_run_progress_timeout_seconds", frozenset(labels.items()))] == timeout
            assert series[("trainguard_run_last_progress_timestamp_seconds", frozenset(labels.items()))] == \
                d["last_progress_ts"]
        [shown] = daemon.readings.runs
        assert shown.verdict == "hung" and shown.timeout_s == timeout
        train(daemon, clock, r0, out / "rank0.log", 1)
        assert [e.status for e in notes.events if e.finding.key.startswith("train.hang:")][-1] is AlertStatus.RESOLVED
    finally:
        daemon.close()


def steady_daemon(tmp_path: Path, pids: list[int]):
    """(clock, recorder, nvml, state dir, daemon): the daemon on a fake clock, the ranks' GPUs computing throughout."""
    clock, notes = FakeClock(), Recorder()
    nvml = nvml_for(pids, clock, hang_at=10**6, hang_state={})
    state = str(tmp_path / "state")
    return clock, notes, nvml, state, Daemon(config(tmp_path), clock=clock, state_dir=state, notifiers=[notes], nvml=nvml)


def test_a_long_evaluation_at_training_power_is_no_alert_and_a_restart_keeps_the_cadence(tmp_path, launched):
    _launcher, (r0, r1), out = launched
    clock, notes, nvml, state, daemon = steady_daemon(tmp_path, [r0, r1])
    try:
        daemon.cycle()
        train(daemon, clock, r0, out / "rank0.log", 5)
        idle(daemon, clock, 30)  # a 5-minute evaluation that logs nothing, GPUs at 300 W
        train(daemon, clock, r0, out / "rank0.log", 2)
        [run] = daemon.progress.cadences.values()
        assert run.normal_gap() == pytest.approx(310.0, rel=1e-3)  # it decays with a day's half-life
    finally:
        daemon.close()
    assert notes.firing("train.") == []
    again = Daemon(config(tmp_path), clock=clock, state_dir=state, notifiers=[notes], nvml=nvml)
    try:
        assert again.progress.cadences[run.run_id].normal_gap() == run.normal_gap()
        idle(again, clock, 40)  # the same evaluation again, after the restart: 400 s < 3 x 310 s
        assert notes.firing("train.") == []
    finally:
        again.close()
    doc = build(config(tmp_path).config, state_dir=state, clock=clock, nvml=nvml)  # `trainguard status`
    [shown] = doc["runs"]
    assert shown["run"] == run.name and shown["verdict"] == "progressing" and shown["normal_gap_s"] == 310.0
    assert sorted((r["rank"], r["pid"]) for r in shown["ranks"]) == [(0, r0), (1, r1)]
    assert shown["last_progress_at"].endswith("+00:00")  # ISO 8601 UTC, as every time of the document
    assert shown["silent_for_s"] == 400.0 and shown["timeout_s"] == pytest.approx(930.0, abs=0.2)
    text = render_text(doc, "zh")
    assert run.name in text and "有进展" in text and "15m" in text


def test_a_run_that_ended_shows_in_status_as_ended_and_how_for_an_hour(tmp_path, launched):
    launcher, (r0, r1), out = launched
    clock, notes, nvml, state, daemon = steady_daemon(tmp_path, [r0, r1])
    try:
        daemon.cycle()
        train(daemon, clock, r0, out / "rank0.log", 3)
        os.kill(r1, signal.SIGKILL)
        os.kill(r0, signal.SIGUSR2)  # rank 0 raises: its traceback ends its output file
        deadline = time.monotonic() + 20
        while not all(has_ended(pid) for pid in (r0, r1)):
            assert time.monotonic() < deadline, "the ranks did not end"
            time.sleep(0.01)
        launcher.wait(timeout=20)
        idle(daemon, clock, 1)
        ended_at = clock.now
    finally:
        daemon.close()
    name = f"torchrun-{launcher.pid}"
    assert notes.firing("train.hang:") == []  # a run that ended is not hung
    clock.advance(1800)  # half an hour later, no daemon running: `trainguard status` still says it
    doc = build(config(tmp_path).config, state_dir=state, clock=clock, nvml=nvml)
    [shown] = doc["runs"]
    assert (shown["run"], shown["verdict"], shown["how"], shown["error"]) == (name, "ended", "error", "RuntimeError: boom")
    assert shown["ended_at"] == time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ended_at))
    text = render_text(doc, "en")
    assert "ended: exited with an error" in text and f"{name}: RuntimeError: boom" in text
    assert "30m ago" in text  # its last progress, 10 s before it was seen gone half an hour ago
    assert "已结束：报错退出" in render_text(doc, "zh")
    clock.advance(1801)  # past the hour: gone
    assert build(config(tmp_path).config, state_dir=state, clock=clock, nvml=nvml)["runs"] == []
