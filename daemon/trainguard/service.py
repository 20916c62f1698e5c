"""The daemon: schedules the cycle on the monotonic clock and wires the stages.

One cycle: sample -> record history -> detectors -> alert lifecycle -> notifiers.
Slow things (hung mounts, deliveries, cleanup scans) live behind bounded waits or
in their own threads, so a cycle always finishes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Sequence

from trainguard import config as configmod
from trainguard.alerts import Lifecycle
from trainguard.clock import Clock, SystemClock
from trainguard.detectors import DetectorInput, evaluate
from trainguard.history import History
from trainguard.notify import LogNotifier, Notifier
from trainguard.records import AlertEvent, Finding, Snapshot
from trainguard.samplers.diskstats import DiskstatsSampler
from trainguard.samplers.fs import FsSampler
from trainguard.state import StateDb, choose_state_dir

log = logging.getLogger(__name__)

COMPACT_EVERY = 3600.0  # seconds between history roll-ups


def series_of(snapshot: Snapshot) -> dict[str, float | None]:
    """The numbers of a snapshot that detectors read back from history."""
    values: dict[str, float | None] = {}
    for s in snapshot.filesystems:
        mp = s.mount.mount_point
        values[f"fs.responsive:{mp}"] = 1.0 if s.responsive else 0.0
        if s.usage is not None and s.responsive:
            values[f"fs.avail_bytes:{mp}"] = s.usage.avail_bytes
            values[f"fs.used_ratio:{mp}"] = s.usage.used_ratio
            values[f"fs.inodes_used_ratio:{mp}"] = s.usage.inodes_used_ratio
    for d in snapshot.disks:
        values[f"disk.util:{d.name}"] = d.util_ratio
        values[f"disk.write_bps:{d.name}"] = d.write_bytes_per_s
        values[f"disk.read_bps:{d.name}"] = d.read_bytes_per_s
    return values


@dataclass(frozen=True, slots=True)
class CycleResult:
    snapshot: Snapshot
    findings: tuple[Finding, ...]
    events: tuple[AlertEvent, ...]
    duration_s: float


@dataclass
class Samplers:
    fs: FsSampler
    disks: DiskstatsSampler

    @classmethod
    def from_config(cls, cfg: configmod.Config, clock: Clock) -> "Samplers":
        fs = cfg.filesystems
        return cls(
            fs=FsSampler(clock=clock, proc_root=cfg.general.proc_root, paths=fs.paths, exclude=fs.exclude,
                         include_fstypes=fs.include_fstypes, timeout=fs.probe_timeout,
                         wait=min(1.0, cfg.general.interval / 2)),
            disks=DiskstatsSampler(clock=clock, proc_root=cfg.general.proc_root),
        )

    def sample(self, now: float) -> Snapshot:
        filesystems, missing = self.fs.sample()
        return Snapshot(ts=now, filesystems=tuple(filesystems), disks=tuple(self.disks.sample()),
                        missing_paths=tuple(missing))


@dataclass
class Daemon:
    loaded: configmod.Loaded
    clock: Clock = field(default_factory=SystemClock)
    state_dir: str | None = None  # --state-dir; else the config's, with a fallback
    notifiers: Sequence[Notifier] | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        self.state_dir = choose_state_dir(self.state_dir or cfg.general.state_dir)
        self.db = StateDb(self.state_dir)
        now = self.clock.time()
        self.history = History.from_config(self.db.connect(), cfg, now)
        self.lifecycle = Lifecycle(self.db.connect(), repeat_interval=cfg.alerts.repeat_interval,
                                   keep_firing_for=cfg.alerts.keep_firing_for)
        self.samplers = Samplers.from_config(cfg, self.clock)
        self.notifiers = list(self.notifiers) if self.notifiers is not None else [LogNotifier()]
        self.latest: CycleResult | None = None
        self.stop_event = threading.Event()
        self.reload_event = threading.Event()
        self._last_compact = self.clock.monotonic()

    @property
    def config(self) -> configmod.Config:
        return self.loaded.config

    def cycle(self) -> CycleResult:
        started = self.clock.monotonic()
        now = self.clock.time()
        snapshot = self.samplers.sample(now)
        self.history.record(now, series_of(snapshot))
        findings = evaluate(DetectorInput(self.config, self.history, snapshot, now, self.lifecycle.active))
        events = self.lifecycle.update(findings, now)
        for notifier in self.notifiers:
            try:
                notifier.notify(events)
            except Exception:  # one broken notifier must not stop the others or the loop
                log.exception("notifier %s failed", type(notifier).__name__)
        if self.clock.monotonic() - self._last_compact >= COMPACT_EVERY:
            self.history.compact(now)
            self._last_compact = self.clock.monotonic()
        self.latest = CycleResult(snapshot, tuple(findings), tuple(events), self.clock.monotonic() - started)
        return self.latest

    def reload(self) -> bool:
        """Re-read the config file; a bad new config is reported and the old one kept."""
        path = None if self.loaded.source == "built-in defaults" else self.loaded.source
        try:
            new = configmod.load(path)
        except configmod.ConfigError as exc:
            for problem in exc.problems:
                log.error("reload rejected, keeping the running config: %s: %s", exc.source, problem)
            return False
        self.loaded = new
        cfg = new.config
        self.samplers = Samplers.from_config(cfg, self.clock)
        self.lifecycle.configure(repeat_interval=cfg.alerts.repeat_interval,
                                 keep_firing_for=cfg.alerts.keep_firing_for)
        log.info("configuration reloaded from %s", new.source)
        return True

    def run(self) -> None:
        """Cycle every interval until stop_event is set. Ticks are on the monotonic clock."""
        interval = self.config.general.interval
        next_tick = self.clock.monotonic()
        while not self.stop_event.is_set():
            if self.reload_event.is_set():
                self.reload_event.clear()
                self.reload()
                interval = self.config.general.interval
            try:
                self.cycle()
            except Exception:  # keep watching: one bad cycle is logged, the next one may work
                log.exception("cycle failed")
            next_tick += interval
            now = self.clock.monotonic()
            if next_tick < now:  # fell behind (suspend, slow cycle): skip missed ticks, no burst
                next_tick = now + interval
            self._wait(next_tick - now)
        self.close()

    def _wait(self, seconds: float) -> None:
        deadline = self.clock.monotonic() + seconds
        while not self.stop_event.is_set() and not self.reload_event.is_set():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            self.stop_event.wait(min(left, 0.5))

    def close(self) -> None:
        for notifier in self.notifiers:
            try:
                notifier.close()
            except Exception:
                log.exception("closing notifier %s failed", type(notifier).__name__)

    def install_signal_handlers(self) -> None:
        def stop(signum, _frame):
            log.info("received %s, stopping", signal.Signals(signum).name)
            self.stop_event.set()

        def reload(_signum, _frame):
            self.reload_event.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)


def setup_logging(level: str = "info") -> None:
    """One line per event on stderr; under systemd the journal adds time and host itself."""
    under_journal = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "%(levelname)s %(name)s: %(message)s" if under_journal else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, force=True)
