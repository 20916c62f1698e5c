"""Slow diagnosis work stays off the cycle: a stall alert waits for its diagnosis at most the deadline,
goes out with what is known and says the diagnosis timed out, and gets the full diagnosis when it is in.
Here the slow part is a py-spy that does not answer (a real child process): it is killed and reaped."""

from __future__ import annotations

import os
import stat
import time

from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.records import Finding, Severity, Snapshot

from tests.test_gpu_diagnosis import _gpu_holding, stuck_trainer  # noqa: F401 - the fixture

STALL = Finding("gpu.stall:0", Severity.CRITICAL, "GPU 0 stalled", details={"gpu": 0, "util_recent": [0.0]})


def _hanging_py_spy(tmp_path):
    exe = tmp_path / "py-spy"
    pids = tmp_path / "py-spy.pids"
    exe.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe), pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _slow_diagnoser(pid: int, tmp_path, deadline: float):
    """A diagnoser of a GPU held by pid whose py-spy never answers; I/O counters already observed."""
    exe, pids = _hanging_py_spy(tmp_path)
    clock, gpu = _gpu_holding(pid)
    snapshot = Snapshot(ts=clock.now, gpus=(gpu,))
    diagnoser = StallDiagnoser(py_spy=True, py_spy_path=exe, deadline=deadline, clock=clock)
    diagnoser.observe(snapshot)
    return clock, gpu, snapshot, diagnoser, pids


def test_late_diagnosis_does_not_hold_the_alert_and_arrives_later(stuck_trainer, tmp_path):
    child, _tid, events, _fs = stuck_trainer
    clock, gpu, snapshot, diagnoser, pids = _slow_diagnoser(child.pid, tmp_path, deadline=1.0)
    started = time.monotonic()
    (first,) = diagnoser.enrich([STALL], snapshot, clock.now)
    assert time.monotonic() - started < 2.0
    assert first.details["diagnosis_timed_out"] and "diagnosis timed out after 1s" in first.summary
    assert first.details["diagnosis"]["processes"][0]["host_pid"] == child.pid  # what NVML said is there
    job = diagnoser.worker.latest(("stall", 0))
    assert job.wait(15)
    clock.advance(10)
    (second,) = diagnoser.enrich([STALL], snapshot, clock.now)
    assert not second.details["diagnosis_timed_out"] and str(events) in second.summary
    (pid,) = map(int, pids.read_text().split())
    assert _gone(pid)  # py-spy ran past its time: killed and reaped


def test_close_kills_a_py_spy_still_running(stuck_trainer, tmp_path):
    child, _tid, _events, _fs = stuck_trainer
    _clock, gpu, snapshot, diagnoser, pids = _slow_diagnoser(child.pid, tmp_path, deadline=0.5)
    (d,) = diagnoser.diagnose_within([gpu], snapshot)
    assert d.timed_out
    deadline = time.monotonic() + 10
    while not pids.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    diagnoser.close()
    (pid,) = map(int, pids.read_text().split())
    assert _gone(pid)


def test_daemon_sends_the_stall_again_once_its_late_diagnosis_is_in(stuck_trainer, tmp_path):
    from trainguard.records import AlertStatus
    from trainguard.sources.gpu import GpuSampler

    from tests.gpu_support import GiB, fake_pynvml, gpu_spec
    from tests.support.clock import FakeClock
    from tests.support.fake_daemon import FakeDisk, Recorder, daemon

    child, _tid, events, _fs = stuck_trainer
    exe, _pids = _hanging_py_spy(tmp_path)
    clock, recorder = FakeClock(), Recorder()
    d = daemon(tmp_path, clock, FakeDisk(), recorder,
               {"general": {"interval": "10s"}, "gpu": {"for": "60s"}, "alerts": {"keep_firing_for": "0s"}})
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                                     "processes": [{"pid": child.pid, "used": 76 * GiB}]}])]},
                                clock=clock.time)
    d.samplers.gpu = GpuSampler(nvml, clock=clock.time, host_pid_view=True, xid_events=False)
    d.diagnoser = StallDiagnoser(py_spy=True, py_spy_path=exe, deadline=0.5, clock=clock.time)
    try:
        stalls = []
        while not stalls:
            clock.advance(10)
            d.cycle()
            stalls = [e for e in recorder.events if e.finding.kind == "gpu.stall"]
            assert clock.time() < 1_700_000_000 + 600, "the stall never fired"
        (first,) = stalls
        assert first.status is AlertStatus.FIRING and first.finding.details["diagnosis_timed_out"]
        assert d.diagnoser.worker.latest(("stall", 0)).wait(15)
        clock.advance(10)
        d.cycle()
        later = [e for e in recorder.events if e.finding.kind == "gpu.stall"][1:]
        assert [e.status for e in later] == [AlertStatus.FIRING] and later[0].repeat
        assert str(events) in later[0].finding.summary and not later[0].finding.details["diagnosis_timed_out"]
        clock.advance(10)
        d.cycle()
        assert len([e for e in recorder.events if e.finding.kind == "gpu.stall"]) == 2  # sent again once
    finally:
        d.close()
