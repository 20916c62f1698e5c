"""Helpers for GPU tests: load the fake pynvml, a fake clock, and a scenario driver that runs
sampler -> history -> detectors -> alert lifecycle exactly like the daemon cycle does."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainguard import config as configmod
from trainguard.alerts.lifecycle import Lifecycle
from trainguard.detectors import DetectorInput
from trainguard.detectors.gpu import GPU_DETECTORS
from trainguard.detectors.series import gpu_series
from trainguard.records import AlertEvent, AlertStatus, Finding, Snapshot
from trainguard.sources.gpu import GpuSampler
from trainguard.store.history import History

FAKE_DIR = Path(__file__).resolve().parent / "fake_nvml"
GiB = 1024**3


def load_fake():
    """The fake pynvml as its own module object (not installed as `pynvml`)."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_pynvml"] = module  # the module looks itself up while building its error classes
    spec.loader.exec_module(module)
    return module


fake_pynvml = load_fake()


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def gpu_spec(timeline, **extra):
    return {"name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB, "timeline": timeline, **extra}


@dataclass
class Scenario:
    """Drives the GPU part of the daemon cycle on a fake clock."""

    script: dict
    config: configmod.Config = field(default_factory=lambda: configmod.parse({}, "test"))
    interval: float = 10.0
    host_pid_view: bool | None = True

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.nvml = fake_pynvml.FakeNvml(self.script, clock=self.clock)
        self.sampler = GpuSampler(self.nvml, clock=self.clock, host_pid_view=self.host_pid_view, xid_events=False)
        self.history = History(None, window=6 * 3600, fine_window=3600)
        self.lifecycle = Lifecycle(None, repeat_interval=4 * 3600,
                                   keep_firing_for=self.config.alerts.keep_firing_for)
        self.events: list[tuple[float, AlertEvent]] = []
        self.last_snapshot: Snapshot | None = None
        self.last_findings: list[Finding] = []

    @property
    def elapsed(self) -> float:
        return self.clock.now - self.nvml.t0

    def step(self) -> list[Finding]:
        self.clock.advance(self.interval)
        now = self.clock.now
        reading = self.sampler.sample()
        snapshot = Snapshot(ts=now, gpus=reading.gpus, gpu_status=reading.status)
        self.history.record(now, gpu_series(snapshot))
        inp = DetectorInput(self.config, self.history, snapshot, now, self.lifecycle.active)
        findings = [f for detector in GPU_DETECTORS.values() for f in detector(inp)]
        for event in self.lifecycle.update(findings, now):
            self.events.append((self.elapsed, event))
        self.last_snapshot, self.last_findings = snapshot, findings
        return findings

    def run_until(self, elapsed: float) -> None:
        while self.elapsed + self.interval <= elapsed + 1e-9:
            self.step()

    def firing(self, kind: str) -> list[tuple[float, AlertEvent]]:
        return [(t, e) for t, e in self.events
                if e.status is AlertStatus.FIRING and not e.repeat and e.finding.kind == kind]

    def resolved(self, kind: str) -> list[tuple[float, AlertEvent]]:
        return [(t, e) for t, e in self.events if e.status is AlertStatus.RESOLVED and e.finding.kind == kind]


def dead_pid() -> int:
    """A PID that existed and is gone (reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
