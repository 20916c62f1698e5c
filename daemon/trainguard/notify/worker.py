"""Delivery: the OutboxNotifier the daemon calls, and one worker thread per target.

notify() only writes rows to the outbox (a few milliseconds) and wakes the workers:
sampling never waits on a network. Each target has its own thread, so a DingTalk robot
that hangs does not hold up the e-mail. A worker sends the due rows of its target as
one message per host (group_wait delays the first send of new alerts so one cycle's
findings go together; after a send, new alerts wait group_interval and go together),
respects the target's rate limit, and retries a failed message with backoff until
max_age, when it gives up with a logged error.
"""

from __future__ import annotations

import logging
import random as random_module
import sqlite3
import threading
import time
from typing import Callable, Protocol, Sequence

from trainguard.clock import Clock, SystemClock
from trainguard.config import Notify, NotifyTarget
from trainguard.notify.apprise_sender import AppriseSender, Delivery, rate_limit_of
from trainguard.notify.messages import MAX_LISTED, Message, compose, finding_tags, owned_by
from trainguard.notify.outbox import Outbox, backoff, memory_outbox
from trainguard.records import AlertEvent, Severity
from trainguard.redact import Redactor, redact_url
from trainguard.store.state import StateDb
from trainguard.store.writes import WriteHealth, is_write_error
from trainguard.units import format_duration

log = logging.getLogger("trainguard.notify")

IDLE_WAIT = 60.0  # a worker with nothing pending still looks at the outbox this often
DRAIN_TIMEOUT = 3.0  # close() waits at most this long for sends in flight
PRUNE_EVERY = 3600.0


class Sender(Protocol):
    def send(self, target: NotifyTarget, message: Message) -> Delivery: ...


class TokenBucket:
    """per_minute messages, in bursts of up to per_minute; 0 is unlimited."""

    def __init__(self, per_minute: int, monotonic: Callable[[], float]):
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.monotonic = monotonic
        self.tokens = self.capacity
        self.updated = monotonic()

    def _refill(self) -> None:
        now = self.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_time(self) -> float:
        """Seconds until a message may go (0: now)."""
        if self.capacity <= 0:
            return 0.0
        self._refill()
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self) -> None:
        if self.capacity > 0:
            self._refill()
            self.tokens -= 1.0


def below_floor(target: NotifyTarget, severity: Severity) -> bool:
    """The target's severity floor: it is not sent alerts less severe than this."""
    return severity.rank < Severity(target.severity).rank


def accepts(target: NotifyTarget, event: AlertEvent) -> bool:
    """The target's severity floor, its owner route ([gpu] act = "notify-owner") and tag routing."""
    if below_floor(target, event.finding.severity):
        return False
    if target.owners and not owned_by(event.finding, target.owners):
        return False
    return not target.tags or bool(finding_tags(event.finding) & set(target.tags))


class TargetWorker:
    """Delivers one target's outbox rows. step() is the whole logic; run() just repeats it in a thread."""

    def __init__(self, target: NotifyTarget, outbox: Outbox, sender: Sender, settings: Notify, *,
                 clock: Clock, random: Callable[[], float], redactor: Redactor, spill: Outbox | None = None,
                 writes: WriteHealth | None = None):
        self.target = target
        self.outbox = outbox
        self.spill = spill    # the in-memory outbox for alerts the database could not take
        self.writes = writes  # None: a failed database write raises
        self._held: dict[int, float] = {}  # database row id -> held back until (its outcome is not written yet)
        self._unrecorded: list[tuple[str, tuple[int, ...], tuple[object, ...]]] = []
        self.sender = sender
        self.settings = settings
        self.clock = clock
        self.random = random
        self.redactor = redactor
        self.bucket = TokenBucket(rate_limit_of(target), clock.monotonic)
        self.not_before = 0.0  # wall time: group_interval after the last message
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._drain_until = float("inf")
        self.thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.target.name

    def step(self) -> float | None:
        """Send everything due now. Returns the wall time of the next thing to do, None when idle."""
        started = now = self.clock.time()
        self._persist()
        for box in self._boxes():
            self._give_up_old(box, now)
        if now >= self.not_before:
            # A backlog goes out back to back (paced by the rate limit); alerts that arrive while this
            # runs wait for the next step, which honours group_interval.
            while not self._stop.is_set() or time.monotonic() < self._drain_until:
                now = self.clock.time()
                box, entries = self._due(now, started)
                if not entries:
                    break
                wait = self.bucket.wait_time()
                if wait > 0:
                    log.debug("target %r: rate limit reached, next message in %.1fs", self.name, wait)
                    return now + wait
                self.bucket.take()
                if not self._deliver(box, entries):
                    break
        dues = [d for d in (b.next_due(self.name, self._held if b is self.outbox else ()) for b in self._boxes())
                if d is not None]
        dues += [t for t in self._held.values() if t != float("inf")]  # held back after a failed try
        if self._unrecorded:
            dues.append(self.clock.time() + self.settings.retry_initial)  # try writing the outcomes again
        return None if not dues else max(min(dues), self.not_before)

    # -- a state database that cannot be written (full disk): deliver from memory, record later

    def _boxes(self) -> list[Outbox]:
        return [self.outbox] if self.spill is None else [self.outbox, self.spill]

    def _due(self, now: float, started: float) -> tuple[Outbox, list]:
        held = [i for i, until in self._held.items() if until > now]
        for box in self._boxes():
            entries = box.due(self.name, now, MAX_LISTED, created_upto=started,
                              exclude=held if box is self.outbox else ())
            if entries:
                return box, entries
        return self.outbox, []

    def _record(self, box: Outbox, method: str, ids: Sequence[int], *args: object, until: float) -> None:
        """box.method(ids, *args); when the database cannot take it, the outcome is kept here (the rows
        are held back until `until`, so a delivered alert is never sent twice) and written later."""
        if box is not self.outbox or self.writes is None:
            getattr(box, method)(ids, *args)
            return
        if not self.writes.attempt("deliveries", getattr(box, method), ids, *args):
            self._unrecorded.append((method, tuple(ids), args))
            self._held.update((i, until) for i in ids)

    def _persist(self) -> None:
        """Write the outcomes kept in memory, then move this target's memory rows into the database."""
        while self._unrecorded:
            method, ids, args = self._unrecorded[0]
            if not self.writes.attempt("deliveries", getattr(self.outbox, method), ids, *args):
                return
            self._unrecorded.pop(0)
            for i in ids:
                self._held.pop(i, None)
        if self.spill is not None and self.spill.holds(self.name):
            if self.writes.attempt("outbox", self.spill.move_rows, self.name, self.outbox):
                log.info("target %r: the alerts kept in memory are in the state database again", self.name)

    def _deliver(self, box: Outbox, entries: Sequence) -> bool:
        message = compose(entries[0].host, [e.event for e in entries], self.settings.language_for(self.target))
        ids = [e.id for e in entries]
        delivery = self.sender.send(self.target, message)
        done = self.clock.time()
        if delivery.ok:
            self._record(box, "delivered", ids, done, until=float("inf"))
            self.not_before = done + self.settings.group_interval
            log.info("target %r: delivered %s (%d alert%s)", self.name, message.title, len(ids),
                     "" if len(ids) == 1 else "s")
            return True
        reason = self.redactor(delivery.reason)
        self._count_failed()
        if delivery.permanent:
            self._record(box, "fail", ids, done, reason, until=float("inf"))
            log.error("target %r: cannot deliver, giving up on %d alert(s): %s", self.name, len(ids), reason)
            return True
        attempts = max(e.attempts for e in entries) + 1
        delay = backoff(attempts, self.settings.retry_initial, self.settings.retry_max, self.random)
        self._record(box, "retry", ids, done + delay, reason, until=done + delay)
        self.not_before = done + delay  # the target is down: the rest of its queue waits too, not just this batch
        log.warning("target %r: delivery failed (attempt %d), retrying in %s: %s", self.name, attempts,
                    format_duration(delay), reason)
        return False

    def _count_failed(self) -> None:
        if self.writes is None:
            self.outbox.count_failed_attempt(self.name)
        else:
            self.writes.attempt("deliveries", self.outbox.count_failed_attempt, self.name)

    def _give_up_old(self, box: Outbox, now: float) -> None:
        old = [e for e in box.expired(self.name, now - self.settings.max_age) if e.id not in self._held]
        if old:
            last = self.redactor(old[-1].last_error or "never attempted")
            age = format_duration(self.settings.max_age)
            self._record(box, "fail", [e.id for e in old], now, f"gave up after {age}: {last}", until=float("inf"))
            log.error("target %r: gave up on %d undelivered alert(s) older than %s; last error: %s", self.name,
                      len(old), format_duration(self.settings.max_age), last)

    # -- thread

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name=f"notify-{self.name}", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                next_at = self.step()
            except Exception:  # a broken database or plugin must not kill delivery for good
                log.exception("target %r: delivery step failed", self.name)
                next_at = self.clock.time() + self.settings.retry_initial
            if self._stop.is_set():
                return
            timeout = IDLE_WAIT if next_at is None else min(IDLE_WAIT, max(0.0, next_at - self.clock.time()))
            self._wake.wait(timeout)

    def stop(self, drain_s: float) -> None:
        """Ask the thread to finish: it sends what is due for up to drain_s more, then returns."""
        self._drain_until = time.monotonic() + drain_s  # real time: it bounds a real thread
        self._stop.set()
        self._wake.set()


class OutboxNotifier:
    """The Notifier the daemon uses when notify targets are configured."""

    def __init__(self, db: StateDb, settings: Notify, host: str, *, clock: Clock | None = None,
                 sender: Sender | None = None, random: Callable[[], float] = random_module.random,
                 start: bool = True, writes: WriteHealth | None = None):
        self.db = db
        self.writes = writes
        self.spill = memory_outbox() if writes is not None else None
        self.clock = clock or SystemClock()
        self.random = random
        self.start_threads = start
        self.outbox = Outbox(db.connect())
        self.redactor = Redactor()
        self.sender: Sender = sender if sender is not None else AppriseSender(self.redactor)
        self.workers: dict[str, TargetWorker] = {}
        self._lock = threading.Lock()
        self._last_prune = float("-inf")
        self.settings: Notify | None = None
        self.host = host
        self.configure(settings, host)

    def configure(self, settings: Notify, host: str) -> None:
        """(Re)build the targets: on start and on reload. Rows of removed targets are failed, not kept forever."""
        with self._lock:
            old, self.workers = self.workers, {}
            # Workers hold the delivery settings: if those changed, every target restarts.
            def delivery(n: Notify) -> Notify:
                return n.model_copy(update={"targets": []})

            changed = self.settings is None or host != self.host or delivery(settings) != delivery(self.settings)
            self.settings, self.host = settings, host
            self.redactor = Redactor(t.url for t in settings.targets)
            if isinstance(self.sender, AppriseSender):
                self.sender.set_redactor(self.redactor)
            # An unchanged target keeps its thread: a send in flight is never started twice.
            keep = {t.name: old.pop(t.name) for t in settings.targets
                    if not changed and t.name in old and old[t.name].target == t}
            for worker in old.values():
                worker.stop(0.0)
            self._join(old.values(), DRAIN_TIMEOUT)
            removed = self.outbox.fail_targets_except([t.name for t in settings.targets], self.clock.time())
            if removed:
                log.warning("%d undelivered alert(s) were for targets no longer configured; marked failed", removed)
            for target in settings.targets:
                if target.name in keep:
                    self.workers[target.name] = keep[target.name]
                    continue
                worker = TargetWorker(target, Outbox(self.db.connect()), self.sender, settings, clock=self.clock,
                                      random=self.random, redactor=self.redactor, spill=self.spill,
                                      writes=self.writes)
                worker.redactor = self.redactor
                self.workers[target.name] = worker
                log.info("notify target %r: %s", target.name, redact_url(target.url))
                if self.start_threads:
                    worker.start()
            for worker in keep.values():
                worker.redactor = self.redactor

    def notify(self, events: Sequence[AlertEvent]) -> None:
        now = self.clock.time()
        with self._lock:
            items = [(t.name, self.host, e) for e in events for t in self.settings.targets if accepts(t, e)]
            if items:
                dropped = self._enqueue(items, now)
                if dropped:
                    log.warning("outbox is full (notify.max_pending = %d): dropped the %d oldest least severe "
                                "undelivered alert(s)", self.settings.max_pending, dropped)
                for name in {name for name, _, _ in items}:
                    self.workers[name].wake()
            if now - self._last_prune >= PRUNE_EVERY:
                if self.writes is None or self.writes.attempt("outbox", self.outbox.prune, now):
                    self._last_prune = now

    def _enqueue(self, items: list, now: float) -> int:
        """Into the database; when it cannot be written, into the memory outbox the workers also send from."""
        args = dict(delay=self.settings.group_wait, max_pending=self.settings.max_pending)
        if self.spill is None:
            return self.outbox.enqueue(items, now, **args)
        try:
            dropped = self.outbox.enqueue(items, now, **args)
        except sqlite3.OperationalError as exc:
            if not is_write_error(exc):
                raise
            self.writes.failed("outbox", exc)
            return self.spill.enqueue(items, now, **args)
        self.writes.succeeded("outbox")
        return dropped

    def close(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Stop the workers; what is due is still sent for up to `timeout`, the rest waits in the outbox."""
        with self._lock:
            for worker in self.workers.values():
                worker.stop(timeout)
            self._join(self.workers.values(), timeout + 0.5)
            stuck = [w.name for w in self.workers.values() if w.thread is not None and w.thread.is_alive()]
            if stuck:
                log.warning("notify targets still sending at shutdown: %s; their alerts stay in the outbox",
                            ", ".join(map(repr, stuck)))
            self._save_spill()

    def _save_spill(self) -> None:
        """Alerts kept in memory (the database could not take them) go to the database now, or are named lost."""
        if self.spill is None:
            return
        for name in [t.name for t in self.settings.targets if self.spill.holds(t.name)]:
            if not self.writes.attempt("outbox", self.spill.move_rows, name, self.outbox):
                pending = len(self.spill.expired(name, float("inf")))
                if pending:
                    log.error("target %r: %d undelivered alert(s) were kept in memory (the state database cannot "
                              "be written) and are lost at this exit", name, pending)

    def _join(self, workers, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in workers:
            if worker.thread is not None:
                worker.thread.join(max(0.0, deadline - time.monotonic()))
