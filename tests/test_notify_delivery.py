"""Alert delivery end to end: outbox -> worker -> apprise -> a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import sqlite3
import time

import pytest
from trainguard import config
from trainguard.notify.outbox import Outbox, backoff, summary
from trainguard.notify.worker import OutboxNotifier, TokenBucket
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.store.state import StateDb

HOST = "gpu-07"


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - 1_700_000_000.0

    def advance_to(self, t: float) -> None:
        assert t >= self.now
        self.now = t


def finding(key="fs.usage:/data", severity=Severity.CRITICAL, **details) -> Finding:
    return Finding(key=key, severity=severity, summary=f"{key.split(':')[-1]} 96.1% full, ~40m left",
                   details={"mountpoint": "/data", "avail_bytes": 2 * 2**30, **details},
                   labels={"mountpoint": "/data"}, value=0.961, threshold=0.9, hint="delete old checkpoints")


def firing(f: Finding, now: float) -> AlertEvent:
    return AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now)


def settings(url: str, **notify) -> config.Notify:
    target = {"name": "hook", "url": url, "timeout": "1s"}
    target.update(notify.pop("target", {}))
    return config.parse({"notify": {"targets": [target], **notify}}, "test").notify


def rows(state_dir) -> list[tuple]:
    conn = sqlite3.connect(f"{state_dir}/state.db")
    try:
        return conn.execute("SELECT state, attempts, last_error FROM outbox ORDER BY id").fetchall()
    finally:
        conn.close()


def test_webhook_receives_the_alert_as_stable_json_fields(http_receiver, tmp_path):
    notifier = OutboxNotifier(StateDb(str(tmp_path)), settings(f"json://127.0.0.1:{http_receiver.port}/hook"), HOST)
    try:
        now = time.time()
        notifier.notify([firing(finding(action_taken="cleanup freed 3.0 GiB"), now)])
        (request,) = http_receiver.wait_for(1, timeout=10)
    finally:
        notifier.close()
    doc = request.json()
    assert request.path == "/hook" and request.method == "POST"
    assert doc["host"] == HOST and doc["key"] == "fs.usage:/data"
    assert doc["severity"] == "critical" and doc["status"] == "firing"
    assert doc["summary"] == "/data 96.1% full, ~40m left"
    assert doc["details"]["avail_bytes"] == 2 * 2**30
    assert doc["value"] == 0.961 and doc["threshold"] == 0.9
    assert doc["started_at"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(now)))
    assert doc["title"] == "gpu-07 /data 96.1% full, ~40m left"
    assert "Action taken: cleanup freed 3.0 GiB" in doc["message"]
    assert "Next step: delete old checkpoints" in doc["message"]
    assert rows(tmp_path) == [("delivered", 1, None)]


def test_one_cycle_of_findings_is_one_message(http_receiver, tmp_path):
    notifier = OutboxNotifier(StateDb(str(tmp_path)), settings(f"json://127.0.0.1:{http_receiver.port}/h"), HOST)
    try:
        now = time.time()
        notifier.notify([firing(finding("fs.usage:/data"), now),
                         firing(finding("fs.inodes:/scratch", Severity.WARNING), now),
                         AlertEvent(AlertStatus.RESOLVED, finding("disk.saturated:sda", Severity.WARNING),
                                    started_at=now - 5400, ts=now)])
        (request,) = http_receiver.wait_for(1, timeout=10)
        time.sleep(0.3)  # nothing else may follow; the outbox says why below
    finally:
        notifier.close()
    doc = request.json()
    assert len(http_receiver.requests) == 1
    assert doc["count"] == 3 and [a["key"] for a in doc["alerts"]] == [
        "fs.usage:/data", "fs.inodes:/scratch", "disk.saturated:sda"]
    assert doc["alerts"][2]["status"] == "resolved" and doc["alerts"][2]["duration_seconds"] == 5400
    assert doc["title"].endswith("(+2 more)")
    assert "OK again after 1h30m" in doc["message"]
    assert [r[0] for r in rows(tmp_path)] == ["delivered"] * 3


@pytest.mark.parametrize("failure", ["http 500", "timeout", "connection refused"])
def test_failed_deliveries_back_off_and_arrive_exactly_once(http_receiver, tmp_path, failure):
    clock = FakeClock()
    notify = settings(f"json://127.0.0.1:{http_receiver.port}/hook", retry_initial="10s", retry_max="30s")
    notifier = OutboxNotifier(StateDb(str(tmp_path)), notify, HOST, clock=clock, random=lambda: 0.5, start=False)
    worker = notifier.workers["hook"]
    notifier.notify([firing(finding(), clock.now)])
    t0 = clock.now
    tries = []
    if failure == "http 500":
        http_receiver.fail_next(3, status=500)
    elif failure == "timeout":
        http_receiver.hang_next(3, seconds=3.0, status=504)  # the target's timeout is 1 s: it gives up first
    else:
        http_receiver.stop()
    for _ in range(3):
        tries.append(clock.now - t0)
        next_at = worker.step()
        clock.advance_to(next_at)
    if failure == "connection refused":
        http_receiver.start()
    tries.append(clock.now - t0)
    assert worker.step() is None  # delivered, nothing left
    # backoff(n) = min(30, 10 * 2^(n-1)) * (0.5 + 0.5 * 0.5)
    assert tries == [0.0, 7.5, 7.5 + 15.0, 7.5 + 15.0 + 22.5]
    arrived = [r for r in http_receiver.requests if r.status == 200]
    assert len(arrived) == 1 and arrived[0].json()["key"] == "fs.usage:/data"
    state, attempts, error = rows(tmp_path)[0]
    assert (state, attempts, error) == ("delivered", 4, None)
    notifier.close()


def test_failure_reason_comes_from_apprise_and_shows_in_status(http_receiver, tmp_path):
    clock = FakeClock()
    notifier = OutboxNotifier(StateDb(str(tmp_path)), settings(f"json://127.0.0.1:{http_receiver.port}/hook"),
                              HOST, clock=clock, random=lambda: 0.0, start=False)
    http_receiver.fail_next(1, status=503)
    notifier.notify([firing(finding(), clock.now)])
    next_at = notifier.workers["hook"].step()
    assert next_at == clock.now + 5.0  # retry_initial 10 s, jitter factor 0.5
    (state, attempts, error), = rows(tmp_path)
    assert state == "pending" and attempts == 1 and "503" in error
    doc = summary(sqlite3.connect(f"file:{tmp_path}/state.db?mode=ro", uri=True), clock.now)
    assert doc["pending"] == 1
    assert doc["retrying"][0]["target"] == "hook" and doc["retrying"][0]["next_try"] == next_at
    assert "503" in doc["retrying"][0]["last_error"]
    notifier.close()


def test_undelivered_alerts_are_given_up_after_max_age(tmp_path, caplog):
    clock = FakeClock()
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    notifier = OutboxNotifier(StateDb(str(tmp_path)), settings(f"json://127.0.0.1:{port}/x", max_age="1m"),
                              HOST, clock=clock, random=lambda: 0.0, start=False)
    worker = notifier.workers["hook"]
    notifier.notify([firing(finding(), clock.now)])
    next_at = worker.step()
    clock.advance_to(clock.now + 61)
    assert worker.step() is None
    (state, attempts, error), = rows(tmp_path)
    assert state == "failed" and attempts == 1 and error.startswith("gave up after 1m")
    assert any(r.levelname == "ERROR" and "gave up on 1 undelivered" in r.getMessage() for r in caplog.records)
    assert next_at is not None
    notifier.close()


def test_outbox_bound_drops_the_oldest_least_severe_first(tmp_path):
    outbox = Outbox(StateDb(str(tmp_path)).connect())
    now = 1000.0
    outbox.enqueue([("t", HOST, firing(finding("a", Severity.CRITICAL), now))], now, max_pending=3)
    outbox.enqueue([("t", HOST, firing(finding("b", Severity.WARNING), now))], now + 1, max_pending=3)
    outbox.enqueue([("t", HOST, firing(finding("c", Severity.WARNING), now))], now + 2, max_pending=3)
    dropped = outbox.enqueue([("t", HOST, firing(finding("d", Severity.CRITICAL), now)),
                              ("t", HOST, firing(finding("e", Severity.INFO), now))], now + 3, max_pending=3)
    assert dropped == 2
    keys = [e.event.finding.key for e in outbox.due("t", now + 10, 100)]
    assert keys == ["a", "c", "d"]  # the info one and the oldest warning went
    assert summary(outbox.conn, now + 10)["dropped"] == 2


def test_backoff_doubles_with_jitter_and_is_capped():
    assert [backoff(n, 10, 600, lambda: 0.0) for n in (1, 2, 3, 7, 20)] == [5, 10, 20, 300, 300]
    assert backoff(3, 10, 600, lambda: 0.999999) == pytest.approx(40, abs=1e-3)


def test_rate_limit_queues_the_rest(http_receiver, tmp_path):
    clock = FakeClock()
    notify = settings(f"json://127.0.0.1:{http_receiver.port}/h", group_interval="0s",
                      target={"rate_limit": 2})
    notifier = OutboxNotifier(StateDb(str(tmp_path)), notify, HOST, clock=clock, start=False)
    worker = notifier.workers["hook"]
    # 80 alerts are 4 messages of MAX_LISTED (20): more than one message can group.
    notifier.notify([firing(finding(f"fs.usage:/d{i}"), clock.now) for i in range(80)])
    next_at = worker.step()
    assert len(http_receiver.requests) == 2  # the burst allowance of 2/min
    assert next_at == pytest.approx(clock.now + 30.0, abs=0.01)  # one token per 30 s
    clock.advance_to(next_at)
    worker.step()
    assert [len(r.json()["alerts"]) for r in http_receiver.requests] == [20, 20, 20]
    notifier.close()


def test_group_wait_and_group_interval_batch_later_alerts(http_receiver, tmp_path):
    clock = FakeClock()
    notify = settings(f"json://127.0.0.1:{http_receiver.port}/h", group_wait="30s", group_interval="5m")
    notifier = OutboxNotifier(StateDb(str(tmp_path)), notify, HOST, clock=clock, start=False)
    worker = notifier.workers["hook"]
    notifier.notify([firing(finding("fs.usage:/a"), clock.now)])
    assert worker.step() == clock.now + 30  # waits for the rest of the group
    clock.advance_to(clock.now + 10)
    notifier.notify([firing(finding("fs.usage:/b"), clock.now)])
    clock.advance_to(clock.now + 20)
    worker.step()
    assert [len(r.json()["alerts"]) for r in http_receiver.requests] == [1]  # /b waits its own group_wait
    clock.advance_to(clock.now + 10)
    notifier.notify([firing(finding("fs.usage:/c"), clock.now)])
    next_at = worker.step()
    assert len(http_receiver.requests) == 1 and next_at == clock.now + 290  # group_interval after the send at 30 s
    clock.advance_to(next_at)
    worker.step()
    assert [len(r.json()["alerts"]) for r in http_receiver.requests] == [1, 2]
    notifier.close()


def test_severity_floor_and_tags_route_alerts(tmp_path):
    notify = config.parse({"notify": {"targets": [
        {"name": "mail", "url": "json://127.0.0.1:9/m", "severity": "critical"},
        {"name": "gpu-team", "url": "json://127.0.0.1:9/g", "tags": ["gpu", "mountpoint=/scratch"]},
    ]}}, "t").notify
    notifier = OutboxNotifier(StateDb(str(tmp_path)), notify, HOST, clock=FakeClock(), start=False)
    now = 1.0
    notifier.notify([firing(finding("fs.usage:/data", Severity.WARNING), now),
                     firing(finding("fs.usage:/data2", Severity.CRITICAL), now),
                     firing(Finding("gpu.stall:0", Severity.WARNING, "GPU 0 stalled"), now),
                     firing(Finding("fs.usage:/scratch", Severity.WARNING, "x", labels={"mountpoint": "/scratch"}),
                            now)])
    conn = notifier.outbox.conn
    got = conn.execute("SELECT target, finding FROM outbox ORDER BY id").fetchall()
    routed = sorted((t, json.loads(f)["key"]) for t, f in got)
    assert routed == [("gpu-team", "fs.usage:/scratch"), ("gpu-team", "gpu.stall:0"), ("mail", "fs.usage:/data2")]
    notifier.close()


def test_token_bucket_refills_at_its_rate():
    t = [0.0]
    bucket = TokenBucket(20, lambda: t[0])
    for _ in range(20):
        assert bucket.wait_time() == 0.0
        bucket.take()
    assert bucket.wait_time() == pytest.approx(3.0)
    t[0] = 3.0
    assert bucket.wait_time() == 0.0


def test_a_down_target_is_tried_once_per_backoff_not_once_per_batch(http_receiver, tmp_path):
    clock = FakeClock()
    notifier = OutboxNotifier(StateDb(str(tmp_path)), settings(f"json://127.0.0.1:{http_receiver.port}/h"), HOST,
                              clock=clock, random=lambda: 0.0, start=False)
    worker = notifier.workers["hook"]
    notifier.notify([firing(finding(f"fs.usage:/d{i}"), clock.now) for i in range(60)])  # three messages' worth
    http_receiver.fail_next(1, status=503)
    next_at = worker.step()
    assert len(http_receiver.requests) == 1 and next_at == clock.now + 5.0
    assert worker.step() == next_at and len(http_receiver.requests) == 1  # woken early: still waits
    clock.advance_to(next_at)
    assert worker.step() is None
    assert [len(r.json()["alerts"]) for r in http_receiver.requests[1:]] == [20, 20, 20]
    notifier.close()


def test_reload_keeps_unchanged_targets_and_fails_alerts_of_removed_ones(tmp_path):
    two = config.parse({"notify": {"targets": [{"name": "a", "url": "json://127.0.0.1:9/a"},
                                               {"name": "b", "url": "json://127.0.0.1:9/b"}]}}, "t").notify
    notifier = OutboxNotifier(StateDb(str(tmp_path)), two, HOST, clock=FakeClock(), start=False)
    worker_a = notifier.workers["a"]
    notifier.notify([firing(finding(), 1.0)])
    one = config.parse({"notify": {"targets": [{"name": "a", "url": "json://127.0.0.1:9/a"}]}}, "t").notify
    notifier.configure(one, HOST)
    assert notifier.workers == {"a": worker_a}
    states = dict(notifier.outbox.conn.execute("SELECT target, state FROM outbox").fetchall())
    assert states == {"a": "pending", "b": "failed"}
    notifier.close()
