"""GPU sampler + detectors on scripted NVML timelines (fake pynvml at the module boundary)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from trainguard import config as configmod
from trainguard.records import NvmlState
from trainguard.sources.gpu import GpuSampler

from tests.gpu_support import FakeClock, GiB, Scenario, dead_pid, fake_pynvml, gpu_spec

ME = os.getpid()
FULL = int(76 * GiB)  # 95 % of 80 GiB
PROC = [{"pid": ME, "used": FULL}]


def training(util_by_minute):
    """A timeline from (start_s, util) steps with full VRAM and one compute process."""
    return [{"at": at, "util": util, "mem_used": FULL, "processes": PROC} for at, util in util_by_minute]


def test_stall_fires_once_after_for_and_clears_when_utilisation_returns():
    # Busy 20 min, stalled 20 min (VRAM still full), busy again.
    s = Scenario({"gpus": [gpu_spec(training([(0, 96), (1200, 0), (2400, 95)]))]})
    s.run_until(3000)
    fired = s.firing("gpu.stall")
    assert len(fired) == 1, s.events
    t, event = fired[0]
    # Default for=5m at a 10 s interval: the alert comes no later than for + one interval.
    assert 1200 + 300 - 30 <= t <= 1200 + 300 + 10, t
    assert event.finding.key == "gpu.stall:0"
    assert "stalled" in event.finding.summary and "76.0 GiB/80.0 GiB" in event.finding.summary
    assert event.finding.details["util_mean_ratio"] <= 0.05
    assert event.finding.details["stalled_since"] - s.nvml.t0 == pytest.approx(1200, abs=10)
    resolved = s.resolved("gpu.stall")
    assert len(resolved) == 1
    # Clears on the first busy sample, then the lifecycle's keep_firing_for (1 min).
    assert 2400 <= resolved[0][0] <= 2400 + 60 + 20


def test_eval_gaps_and_checkpoint_saves_do_not_fire():
    steps, t = [], 0
    while t < 3 * 3600:  # 3 h: 30 s eval every 10 min, a 2 min checkpoint save every 30 min
        steps.append((t, 97))
        if t % 1800 == 0 and t:
            steps.append((t + 1, 0))
            steps.append((t + 121, 97))
        steps.append((t + 570, 0))
        t += 600
    s = Scenario({"gpus": [gpu_spec(training(sorted(steps)))]})
    s.run_until(3 * 3600)
    assert s.firing("gpu.stall") == []
    # The trace really had idle samples, or the test could not fail.
    points = s.history.points("gpu.util:0", 0)
    assert any(v == 0 for _, v in points) and any(v > 0.9 for _, v in points)


def test_idle_gpu_without_process_or_with_low_vram_does_not_fire():
    s = Scenario({"gpus": [
        gpu_spec([{"at": 0, "util": 0, "mem_used": FULL, "processes": []}]),           # memory but no process
        gpu_spec([{"at": 0, "util": 0, "mem_used": 10 * GiB, "processes": PROC}]),     # process, little memory
        gpu_spec([{"at": 0, "util": 0, "mem_used": FULL, "processes": PROC}]),         # the real stall
    ]})
    s.run_until(900)
    assert [e.finding.key for _, e in s.firing("gpu.stall")] == ["gpu.stall:2"]


def test_per_gpu_override_changes_the_window_and_ignore_silences():
    cfg = configmod.parse({"gpu": {"overrides": [{"match": "0", "for": "15m"}, {"match": "1", "ignore": True}]}}, "t")
    stall = [{"at": 0, "util": 0, "mem_used": FULL, "processes": PROC}]
    s = Scenario({"gpus": [gpu_spec(stall), gpu_spec(stall), gpu_spec(stall)]}, config=cfg)
    s.run_until(600)
    assert [e.finding.key for _, e in s.firing("gpu.stall")] == ["gpu.stall:2"]
    s.run_until(960)
    assert sorted(e.finding.key for _, e in s.firing("gpu.stall")) == ["gpu.stall:0", "gpu.stall:2"]


def test_busy_burst_between_samples_is_seen_through_the_driver_sample_buffer():
    # A job that computes 4 s out of every 10 looks idle to a 10 s instantaneous poll
    # taken at the wrong moment; the driver's buffer shows the bursts.
    timeline = []
    for t in range(0, 900, 10):
        timeline += [{"at": t + 0.5, "util": 100, "mem_used": FULL, "processes": PROC},
                     {"at": t + 4.5, "util": 0}]
    s = Scenario({"gpus": [gpu_spec(timeline)]})
    s.run_until(900)
    assert s.firing("gpu.stall") == []
    assert 0.3 <= s.last_snapshot.gpus[0].util_ratio <= 0.5


def test_driver_not_loaded_is_a_state_retried_with_backoff():
    s = Scenario({"init": [{"at": 0, "error": "DRIVER_NOT_LOADED"}, {"at": 100, "error": None}],
                  "gpus": [gpu_spec(training([(0, 90)]))]})
    s.step()
    status = s.last_snapshot.gpu_status
    assert status.state is NvmlState.NO_DRIVER and s.last_snapshot.gpus == ()
    assert "driver is not loaded" in status.message
    assert status.next_retry == pytest.approx(s.clock.now + 10)
    s.run_until(70)
    # Backoff doubles: tries at 10, 20, 40, 80 s ... not every cycle.
    assert s.nvml.calls["nvmlInit"] <= 4
    s.run_until(300)
    assert s.last_snapshot.gpu_status.state is NvmlState.OK
    assert len(s.last_snapshot.gpus) == 1


@pytest.mark.parametrize("error,state", [("LIBRARY_NOT_FOUND", NvmlState.NO_LIBRARY),
                                         ("LIB_RM_VERSION_MISMATCH", NvmlState.MISMATCH),
                                         ("NO_PERMISSION", NvmlState.NO_PERMISSION)])
def test_init_failures_map_to_states(error, state):
    s = Scenario({"init_error": error, "gpus": [gpu_spec([])]})
    s.step()
    assert s.last_snapshot.gpu_status.state is state
    assert s.last_snapshot.gpus == ()


def test_no_pynvml_module_means_gpu_part_off():
    sampler = GpuSampler(None, clock=FakeClock())
    reading = sampler.sample()
    assert reading.status.state is NvmlState.NO_LIBRARY and reading.gpus == ()


def test_gpu_lost_mid_run_keeps_sampling_the_others_and_recovers():
    s = Scenario({"gpus": [gpu_spec(training([(0, 90)])),
                           gpu_spec([{"at": 0, "util": 50, "mem_used": GiB},
                                     {"at": 100, "lost": True}, {"at": 400, "lost": False}])]})
    s.run_until(90)
    assert s.last_snapshot.gpu_status.state is NvmlState.OK
    s.run_until(150)
    snap = s.last_snapshot
    assert snap.gpu_status.state is NvmlState.LOST and snap.gpu_status.lost == (1,)
    assert snap.gpus[1].lost and not snap.gpus[0].lost and snap.gpus[0].util_ratio == pytest.approx(0.9)
    s.run_until(1200)
    assert s.last_snapshot.gpu_status.state is NvmlState.OK
    assert not s.last_snapshot.gpus[1].lost and s.last_snapshot.gpus[1].util_ratio == pytest.approx(0.5)


def test_not_supported_fields_are_absent_and_not_asked_again():
    unsupported = ["nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors",
                   "nvmlDeviceGetRetiredPages", "nvmlDeviceGetSamples", "nvmlDeviceGetMemoryInfo_v2",
                   "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"]
    s = Scenario({"gpus": [gpu_spec(training([(0, 42)]), unsupported=unsupported)]})
    for _ in range(5):
        s.step()
    g = s.last_snapshot.gpus[0]
    assert g.temperature_c is None and g.power_w is None and g.ecc_uncorrected is None
    assert g.retired_pages is None and g.throttle_reasons is None
    assert g.errors == {}
    # v1 memory and instantaneous utilisation still work.
    assert g.memory_used_bytes == FULL and g.util_ratio == pytest.approx(0.42)
    assert s.nvml.calls["nvmlDeviceGetTemperature"] == 1
    assert s.nvml.calls["nvmlDeviceGetSamples"] == 1


def test_other_errors_are_per_sample_errors_not_crashes():
    s = Scenario({"gpus": [gpu_spec([{"at": 0, "util": 30, "mem_used": GiB,
                                      "errors": {"nvmlDeviceGetPowerUsage": "UNKNOWN"}},
                                     {"at": 15, "util": 30}])]})
    s.step()
    assert s.last_snapshot.gpus[0].errors == {"power": "Unknown Error"}
    assert s.last_snapshot.gpus[0].power_w is None
    s.step()
    assert s.last_snapshot.gpus[0].power_w == 60.0  # asked again: a transient error is not "absent"


def test_xid_events_from_the_event_thread_become_a_held_critical_alert():
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 90}, {"at": 5, "xid": [79]}])]}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock)
    try:
        sampler.sample()
        clock.advance(10)
        deadline = time.monotonic() + 5
        events = ()
        while not events and time.monotonic() < deadline:
            events = sampler.sample().gpus[0].xid_events
            time.sleep(0.05)
        assert [e.xid for e in events] == [79]
    finally:
        sampler.close()
    from trainguard.detectors.gpu import detect_xid
    from trainguard.detectors.series import gpu_series
    from trainguard.records import GpuSample, Severity, Snapshot
    from trainguard.store.history import History
    h = History(None)
    snap = Snapshot(ts=clock.now, gpus=(GpuSample(0, "GPU-x", "A100", clock.now, xid_events=events),))
    h.record(clock.now, gpu_series(snap))
    cfg = configmod.parse({}, "t").gpu
    later = Snapshot(ts=clock.now + 1800, gpus=(GpuSample(0, "GPU-x", "A100", clock.now + 1800),))
    (finding,) = detect_xid(cfg, h.points, later, clock.now + 1800)
    assert finding.severity is Severity.CRITICAL and "fallen off the bus" in finding.summary
    assert detect_xid(cfg, h.points, later, clock.now + 3700) == []  # xid_hold (1 h) passed


def test_memory_held_by_dead_process_is_reported_never_for_unresolved_pids():
    gone = dead_pid()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{zombie.pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    try:
        procs = [{"pid": gone, "used": 4 * GiB}, {"pid": zombie.pid, "used": 2 * GiB}, {"pid": ME, "used": GiB}]
        s = Scenario({"gpus": [gpu_spec([{"at": 0, "util": 50, "mem_used": 7 * GiB, "processes": procs}])]})
        s.run_until(120)
        keys = sorted(e.finding.key for _, e in s.firing("gpu.orphan"))
        assert keys == sorted([f"gpu.orphan:0:{gone}", f"gpu.orphan:0:{zombie.pid}"])
        summaries = " ".join(e.finding.summary for _, e in s.firing("gpu.orphan"))
        assert "no longer exists" in summaries and "zombie" in summaries
        # Same GPU seen from a container without the host PID namespace: nothing can be said.
        u = Scenario({"gpus": [gpu_spec([{"at": 0, "util": 50, "mem_used": 7 * GiB, "processes": procs}])]},
                     host_pid_view=False)
        u.run_until(120)
        assert u.firing("gpu.orphan") == []
        assert all(p.pid is None and "cannot be resolved" in p.note for p in u.last_snapshot.gpus[0].processes)
    finally:
        zombie.wait()


def test_sustained_thermal_throttle_warns_but_power_cap_alone_does_not():
    hw_thermal, sw_power_cap = 0x40, 0x4
    s = Scenario({"gpus": [gpu_spec([{"at": 0, "util": 99, "throttle": hw_thermal, "temperature": 91}]),
                           gpu_spec([{"at": 0, "util": 99, "throttle": sw_power_cap}])]})
    s.run_until(900)
    fired = s.firing("gpu.throttle")
    assert [e.finding.key for _, e in fired] == ["gpu.throttle:0"]
    assert "hw_thermal" in fired[0][1].finding.summary and "91°C" in fired[0][1].finding.summary


def test_real_pynvml_on_a_host_without_gpu_is_one_info_state(caplog):
    real = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    import ctypes.util
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has libnvidia-ml: the no-GPU path cannot be checked here")
    caplog.set_level("INFO", logger="trainguard.gpu")
    sampler = GpuSampler(real, clock=FakeClock())
    reading = sampler.sample()
    assert reading.status.state is NvmlState.NO_LIBRARY and reading.gpus == ()
    sampler.sample()  # within the backoff: no new attempt, no new log line
    records = [r for r in caplog.records if r.name == "trainguard.gpu"]
    assert len(records) == 1 and records[0].levelname == "INFO"
