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
from dataclasses import dataclass, field, replace
from typing import Sequence

from trainguard import config as configmod
from trainguard.actions.cleanup.record.audit import freed_totals
from trainguard.actions.guard_inbox import GuardInbox
from trainguard.alerts.lifecycle import Lifecycle
from trainguard.clock import Clock, SystemClock
from trainguard.detectors import DetectorInput, evaluate
from trainguard.detectors.follow import learned, seeded
from trainguard.detectors.progress import HANG_PREFIX, fold_stalls
from trainguard.detectors.series import series_of
from trainguard.notify import LogNotifier, Notifier
from trainguard.notify.outbox import failed_attempts
from trainguard.notify.worker import OutboxNotifier
from trainguard.records import AlertEvent, AlertStatus, Finding, Snapshot
from trainguard.service.results import CycleResult, fill_etas, status_line
from trainguard.service.sdnotify import SdNotifier
from trainguard.service.wiring import (
    CleanupNotes,
    configure_outbox,
    make_diagnoser,
    start_cleanup,
    start_mirror,
)
from trainguard.sources.samplers import Samplers
from trainguard.store.cycles import LearnedCycles, belongs, identity
from trainguard.store.heartbeat import Heartbeat
from trainguard.store.history import History
from trainguard.store.progress import ProgressBook
from trainguard.store.state import StateDb, choose_state_dir
from trainguard.store.writes import WriteHealth, unwritable_finding
from trainguard.surfaces.readings import Readings, run_progress
from trainguard.surfaces.server import MetricsServer

log = logging.getLogger(__name__)

COMPACT_EVERY = 3600.0  # seconds between history roll-ups


@dataclass
class Daemon:
    loaded: configmod.Loaded
    clock: Clock = field(default_factory=SystemClock)
    state_dir: str | None = None  # --state-dir; else the config's, with a fallback
    notifiers: Sequence[Notifier] | None = None
    nvml: object = None  # the pynvml module; None: the installed one
    sd: SdNotifier = field(default_factory=SdNotifier)
    one_shot: bool = False  # `run --once`: no heartbeat, so `health` never mistakes it for a daemon

    def __post_init__(self) -> None:
        cfg = self.config
        if cfg.metrics.address is not None:
            # prometheus_client only with metrics on, and before the state is built: loaded after it,
            # the same modules measured 0.5 MiB more RSS (bench/storage_rss.py --scrape-every 15).
            import trainguard.surfaces.exporter  # noqa: F401
        self.state_dir = choose_state_dir(self.state_dir or cfg.general.state_dir)
        self.db = StateDb(self.state_dir)
        # A state db that cannot be written (its disk is full) degrades the cycle, never stops it.
        self.writes = WriteHealth(self.db.path, self.clock.time)
        now = self.clock.time()
        self.history = History.from_config(self.db.connect(), cfg, now)
        self.lifecycle = Lifecycle(self.db.connect(), repeat_interval=cfg.alerts.repeat_interval,
                                   keep_firing_for=cfg.alerts.keep_firing_for, writes=self.writes)
        self.heartbeat = Heartbeat(self.db.connect(), os.getpid())
        # trainguard.guard's events
        self.guard_inbox = GuardInbox(self.state_dir, self.db.connect, clock=self.clock.time,
                                      audit_retention=cfg.history.audit_retention)
        self.samplers = Samplers.from_config(cfg, self.clock, nvml=self.nvml, follow_logs=True)
        self.diagnoser = make_diagnoser(cfg, self.clock)
        if self.notifiers is not None:
            self.notifiers = list(self.notifiers)
        else:
            self.notifiers = [LogNotifier()]
            configure_outbox(self.notifiers, cfg, self.db, self.clock, self.writes)
        self.latest: CycleResult | None = None
        # Each mount's carried fill trend (detectors.follow.Fit), cycle to cycle; the cleanup rhythms it
        # learned are in the state database too, so a restart starts from them.
        self.learned_cycles = LearnedCycles(self.db.connect())
        self.fits: dict = {mp: seeded(rows) for mp, rows in self.learned_cycles.load(now).items()}
        self.fit_fs = dict(self.learned_cycles.learned_on)  # mount -> the filesystem its trend was learned on
        # Each training run's cadence, so a restart in the middle of a run keeps what it learned.
        self.progress = ProgressBook(self.db.connect())
        self.progress.load(now)
        # Swapped as a whole each cycle: a scrape reads one consistent, immutable reference.
        self.readings: Readings | None = None
        self.metrics: MetricsServer | None = None
        self._ready_sent = False
        # Either one also wakes the wait between cycles, which then sleeps until the next tick in one
        # go: waking every 0.5 s to look at them cost more CPU than the cycles (0.1-0.25 ms a wake-up).
        self._wake = threading.Event()
        self.stop_event = _Waking(self._wake)
        self.reload_event = _Waking(self._wake)
        self._last_compact = float("-inf")  # compact on the first cycle: a daemon restarted often still does
        self.cleanup_notes = CleanupNotes()
        self.cleanup = start_cleanup(cfg, self.db.connect, self.clock)
        self.mirror = start_mirror(cfg, self.db.connect, self.clock)

    @property
    def config(self) -> configmod.Config:
        return self.loaded.config

    def cycle(self) -> CycleResult:
        started = self.clock.monotonic()
        now = self.clock.time()
        guard_findings = self.guard_inbox.drain()  # first: its progress heartbeats are this cycle's marks
        snapshot = self.samplers.sample(now, heartbeats=self.guard_inbox.steps)
        if self.cleanup is not None:
            self.cleanup.submit(snapshot)  # never blocks: the worker thread decides and scans
        if self.mirror is not None:  # never blocks either: the mirror threads copy, the cycle reads their states
            self.mirror.submit(snapshot)
            snapshot = replace(snapshot, mirrors=self.mirror.states())
        self.writes.attempt("history", self.history.record, now, series_of(snapshot))
        self._carry_fits(snapshot)
        hung = [k.removeprefix(HANG_PREFIX) for k in self.lifecycle.active if k.startswith(HANG_PREFIX)]
        cadences = self.progress.update(snapshot.runs, snapshot.gpus, now, max_step=3 * self.cycle_interval(),
                                        hung=hung, ended=snapshot.ended_runs)
        self.writes.attempt("progress", self.progress.save, now)
        inp = DetectorInput(self.config, self.history, snapshot, now, self.lifecycle.active, fits=self.fits,
                            progress=cadences)
        findings = fold_stalls(evaluate(inp))  # a hang whose GPUs stall too is one alert
        for mp, fit in self.fits.items():
            self.writes.attempt("cycles", self.learned_cycles.save, mp, learned(fit), now,
                                self.fit_fs.get(mp, ""))
        problem = self.writes.problem()
        if problem is not None:
            findings.append(unwritable_finding(problem, self.state_dir, now))
        # Diagnosis and the risky-placement scan run in the diagnoser's worker; a new stall waits for
        # its diagnosis at most the diagnoser's deadline.
        self.diagnoser.observe(snapshot)
        findings = self.diagnoser.enrich(findings, snapshot, now) + self.diagnoser.placement(snapshot, now)
        if self.one_shot and self.cleanup is not None:
            self.cleanup.settle()  # one cycle is its cleanup too: every due policy run, reported here
        reports = self.cleanup.drain() if self.cleanup is not None else []
        events = self.cleanup_notes.join(self.lifecycle.update(findings, now), reports, now)
        events += [AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now) for f in guard_findings]
        events += self._late_diagnoses(findings, events, now)
        for notifier in self.notifiers:
            try:
                notifier.notify(events)
            except Exception:  # one broken notifier must not stop the others or the loop
                log.exception("notifier %s failed", type(notifier).__name__)
        if self.clock.monotonic() - self._last_compact >= COMPACT_EVERY:
            self.writes.attempt("history", self.history.compact, now)  # on a full disk: next hour, not next cycle
            self._last_compact = self.clock.monotonic()
        duration = self.clock.monotonic() - started
        self.latest = CycleResult(snapshot, tuple(findings), tuple(events), duration, fill_etas(inp))
        self.readings = self._readings(self.latest, now)
        if not self.one_shot:
            self.writes.attempt("heartbeat", self.heartbeat.beat, self.readings.ts, self.status_line())
        return self.latest

    def _carry_fits(self, snapshot: Snapshot) -> None:
        """Carry each mount's trend while it shows the filesystem the trend was learned on: a mount that went
        away, or another disk mounted at the same path, starts with nothing learned."""
        shown = {s.mount.mount_point: identity(s) for s in snapshot.filesystems}
        self.fits = {mp: fit for mp, fit in self.fits.items()
                     if mp in shown and belongs(self.fit_fs.get(mp, ""), shown[mp])}
        self.fit_fs = {mp: fs or self.fit_fs.get(mp, "") for mp, fs in shown.items()}

    def _late_diagnoses(self, findings: Sequence[Finding], events: Sequence[AlertEvent], now: float) -> list[AlertEvent]:
        """A stall alert that went out before its diagnosis was in is sent again once the diagnosis is."""
        due = self.diagnoser.take_updates() - {e.finding.key for e in events}
        out = []
        for f in findings:
            state = self.lifecycle.states.get(f.key) if f.key in due else None
            if state is not None and state.firing_since is not None:
                out.append(AlertEvent(AlertStatus.FIRING, f, started_at=state.firing_since, ts=now, repeat=True))
        return out

    def _readings(self, result: CycleResult, now: float) -> Readings:
        firing: dict[str, int] = {}
        for state in self.lifecycle.firing():
            firing[state.severity.value] = firing.get(state.severity.value, 0) + 1
        return Readings(
            snapshot=result.snapshot, ts=self.clock.time(), cycle_duration_s=result.duration_s,
            fill_eta=result.fill_eta, firing=firing,
            findings=result.findings, cleanup_freed=self._cleanup_freed(),
            notify_failures=self._notify_failures(),
            runs=run_progress(result.snapshot.runs, self.progress.cadences, self.config.progress, now,
                              hung=(f.details.get("run") for f in result.findings if f.kind == "train.hang")),
        )

    def _cleanup_freed(self) -> dict[str, int] | None:
        totals = freed_totals(self.heartbeat.conn)
        if totals is None and self.cleanup is not None:
            return {}  # cleanup configured, nothing freed yet: the counter family exists at 0 series
        return totals

    def _notify_failures(self) -> dict[str, int] | None:
        if not any(isinstance(n, OutboxNotifier) for n in self.notifiers):
            return None  # no delivery targets: no counter family
        return failed_attempts(self.heartbeat.conn, (t.name for t in self.config.notify.targets))

    def status_line(self) -> str:
        if self.latest is None:
            return "starting"
        return status_line(self.latest.snapshot, len(self.lifecycle.firing()))

    def start_metrics(self) -> None:
        """Serve /metrics as configured; a port that cannot be bound is logged, the watching goes on."""
        address = self.config.metrics.address
        if address is None:
            return
        server = MetricsServer(lambda: self.readings, address, pages={"/status": self.status_page},
                               web=self.loaded.web, max_connections=self.config.metrics.max_connections)
        try:
            server.start()
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s (metrics.listen)", self.config.metrics.listen, exc)
            return
        except ValueError as exc:  # a TLS file changed since the config was read: never serve without it
            log.error("cannot serve metrics: %s: %s", self.config.metrics.web_config, exc)
            return
        self.metrics = server

    def status_page(self) -> str:
        """The /status page on the metrics port: use over 24 h, forecast and alerts per mount."""
        from trainguard.surfaces.status import page_doc
        from trainguard.surfaces.status_page import render_page

        r = self.readings
        doc = page_doc(self.config, self.state_dir, r.snapshot if r else None, dict(r.fill_eta) if r else {},
                       self.clock.time())
        return render_page(doc, self.config.notify.language)

    def stop_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None

    def reload(self) -> bool:
        """Re-read the config file; a bad new config is reported and the old one kept."""
        path = None if self.loaded.source == "built-in defaults" else self.loaded.source
        try:
            new = configmod.load(path)
        except configmod.ConfigError as exc:
            for problem in exc.problems:
                log.error("reload rejected, keeping the running config: %s: %s", exc.source, problem)
            return False
        old_listen = self.config.metrics.listen
        self.loaded = new
        self.fits = {mp: seeded(learned(f)) for mp, f in self.fits.items()}  # fitted under the old [forecast]
        cfg = new.config
        if cfg.metrics.listen != old_listen and (self.metrics is not None or old_listen):
            self.stop_metrics()
            self.start_metrics()
        elif self.metrics is not None:  # the web config file may have changed (a renewed certificate)
            try:
                self.metrics.configure(new.web, cfg.metrics.max_connections)
            except ValueError as exc:
                log.error("reload: keeping the metrics port's previous TLS settings: %s: %s",
                          cfg.metrics.web_config, exc)
        self.samplers.close()
        self.samplers = Samplers.from_config(cfg, self.clock, nvml=self.nvml, follow_logs=True)
        self.diagnoser.close()
        self.diagnoser = make_diagnoser(cfg, self.clock)
        self.lifecycle.configure(repeat_interval=cfg.alerts.repeat_interval,
                                 keep_firing_for=cfg.alerts.keep_firing_for)
        if self.cleanup is not None:
            self.cleanup.stop()
        self.cleanup = start_cleanup(cfg, self.db.connect, self.clock)
        if self.mirror is not None:
            self.mirror.stop()
        self.mirror = start_mirror(cfg, self.db.connect, self.clock)
        configure_outbox(self.notifiers, cfg, self.db, self.clock, self.writes)
        log.info("configuration reloaded from %s", new.source)
        return True

    def cycle_interval(self) -> float:
        """general.interval, or gpu.interval when GPUs are to be sampled more often."""
        cfg = self.config
        if cfg.gpu.enabled and cfg.gpu.interval:
            return min(cfg.general.interval, cfg.gpu.interval)
        return cfg.general.interval

    def run(self) -> None:
        """Cycle every interval until stop_event is set. Ticks are on the monotonic clock."""
        interval = self.cycle_interval()
        self._check_watchdog(interval)
        self.start_metrics()
        next_tick = self.clock.monotonic()
        while not self.stop_event.is_set():
            if self.reload_event.is_set():
                self.reload_event.clear()
                self.sd.reloading()
                self.reload()
                interval = self.cycle_interval()
                self._check_watchdog(interval)
                if self._ready_sent:
                    self.sd.ready(self.status_line())
            try:
                self.cycle()
            except Exception:  # keep watching: one bad cycle is logged, the next one may work
                log.exception("cycle failed")
            else:
                # READY after the first good cycle; WATCHDOG only after a completed one, so a
                # wedged loop stops the pings and systemd restarts us.
                if not self._ready_sent:
                    self.sd.ready(self.status_line())
                    self._ready_sent = True
                    log.info("watching %s", watched_mounts(self.latest.snapshot))
                self.sd.watchdog(self.status_line())
            next_tick += interval
            now = self.clock.monotonic()
            if next_tick < now:  # fell behind (suspend, slow cycle): skip missed ticks, no burst
                next_tick = now + interval
            self._wait(next_tick - now)
        self.close()

    def _check_watchdog(self, interval: float) -> None:
        limit = self.sd.watchdog_s
        if limit is not None and interval * 2 > limit:
            log.warning("general.interval %gs is more than half of WatchdogSec=%gs: a slow cycle will get the "
                        "service restarted; raise WatchdogSec in a drop-in", interval, limit)

    def _wait(self, seconds: float) -> None:
        deadline = self.clock.monotonic() + seconds
        while not self.stop_event.is_set() and not self.reload_event.is_set():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            self._wake.wait(left)  # a signal handler runs meanwhile (PEP 475) and may set one of them
            self._wake.clear()  # then the loop looks at both again

    def close(self) -> None:
        self.sd.stopping()
        self.stop_metrics()
        self.samplers.close()
        self.diagnoser.close()
        if self.cleanup is not None:
            self.cleanup.stop()
        if self.mirror is not None:
            self.mirror.stop()
        self.guard_inbox.close()
        for notifier in self.notifiers:
            try:
                notifier.close()
            except Exception:
                log.exception("closing notifier %s failed", type(notifier).__name__)
        # Closing the connections checkpoints the WAL: the db file is complete on its own.
        for conn in (self.history.conn, self.lifecycle.conn, self.heartbeat.conn, self.learned_cycles.conn,
                     self.progress.conn):
            if conn is not None:
                conn.close()
        self.sd.close()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads. A Python handler runs in the main thread between two
        bytecodes, possibly inside Event.wait() holding the very lock set() takes (a plain Lock: a
        deadlock, seen as a daemon that ignored SIGINT). So the handlers do nothing; the kernel's
        signal number comes through set_wakeup_fd to a thread that logs and sets the events."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda _n, _f: None)

        def relay() -> None:
            while data := os.read(read_end, 64):
                for signum in data:
                    if signum == signal.SIGHUP:
                        self.reload_event.set()
                    elif signum in (signal.SIGTERM, signal.SIGINT):
                        log.info("received %s, stopping", signal.Signals(signum).name)
                        self.stop_event.set()

        threading.Thread(target=relay, name="trainguard-signals", daemon=True).start()


class _Waking(threading.Event):
    """An Event whose set() also sets `wake`: the daemon waits on that one for stop and reload both."""

    def __init__(self, wake: threading.Event):
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.set()


def watched_mounts(snapshot: Snapshot) -> str:
    """For the log at start: "3 mounts: / (ext4), /data (xfs), /root/autodl-fs (fuse.juicefs)"."""
    mounts = [f"{s.mount.mount_point} ({s.mount.fstype})" for s in snapshot.filesystems]
    return f"{len(mounts)} mount{'s' if len(mounts) != 1 else ''}: {', '.join(mounts) or 'none'}"
