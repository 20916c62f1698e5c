"""DingTalk: the robot's host is public and unreachable here, so the request is caught at the
HTTP client boundary (requests.Session.request, which requests.post goes through) and checked
byte for byte. Nothing leaves the machine: any other request fails the test."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from trainguard import config
from trainguard.notify.apprise_sender import AppriseSender
from trainguard.notify.worker import OutboxNotifier
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.store.state import StateDb

SECRET = "SEC0123456789abcdef"
TOKEN = "a1b2c3d4e5f6deadbeef"


class FakeResponse:
    def __init__(self, status: int, body: dict):
        self.status_code = status
        self.content = json.dumps(body).encode()
        self.text = self.content.decode()

    def json(self):
        return json.loads(self.content)


@pytest.fixture
def dingtalk(monkeypatch):
    """Answers requests to the DingTalk robot API with a scripted body; records them."""
    calls: list[dict] = []
    answers: list[tuple[int, dict]] = []

    def request(self, method, url, **kwargs):
        if not url.startswith("https://oapi.dingtalk.com/robot/send?"):
            raise AssertionError(f"unexpected request to {url}")
        calls.append({"method": method, "url": url, **kwargs})
        status, body = answers.pop(0) if answers else (200, {"errcode": 0, "errmsg": "ok"})
        return FakeResponse(status, body)

    monkeypatch.setattr(requests.Session, "request", request)
    return calls, answers


def target(url: str) -> config.NotifyTarget:
    return config.parse({"notify": {"targets": [{"name": "robot", "url": url}]}}, "t").notify.targets[0]


def event() -> AlertEvent:
    now = time.time()
    f = Finding("fs.forecast:/root/autodl-tmp", Severity.CRITICAL, "/root/autodl-tmp 96.1% full, ~40m left",
                details={"mountpoint": "/root/autodl-tmp", "eta_seconds": 2400, "action_taken": "cleanup freed 12 GiB",
                         "avail_bytes": 2 * 2**30, "used_ratio": 0.961, "fill_bytes_per_second": 2**30 / 1200,
                         "fitted_span_seconds": 7200},
                hint="move checkpoints to the data disk")
    return AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now)


def test_signed_markdown_request(dingtalk):
    calls, _ = dingtalk
    from trainguard.notify.messages import compose

    before = int(time.time() * 1000)
    delivery = AppriseSender().send(target(f"dingtalk://{SECRET}@{TOKEN}/"), compose("gpu-07", [event()]))
    after = int(time.time() * 1000)
    assert delivery.ok, delivery.reason
    (call,) = calls
    assert call["method"].lower() == "post"
    url = urlsplit(call["url"])
    assert (url.scheme, url.netloc, url.path) == ("https", "oapi.dingtalk.com", "/robot/send")
    query = parse_qs(url.query)
    assert query["access_token"] == [TOKEN]
    timestamp = query["timestamp"][0]
    assert before <= int(timestamp) <= after + 1  # the plugin rounds to the nearest millisecond
    expected = base64.b64encode(hmac.new(SECRET.encode(), f"{timestamp}\n{SECRET}".encode(),
                                         hashlib.sha256).digest()).decode()
    assert query["sign"] == [expected]  # encoded once on the wire, as DingTalk verifies it
    payload = json.loads(call["data"])
    assert payload["msgtype"] == "markdown"
    assert payload["markdown"]["title"] == "gpu-07 /root/autodl-tmp 96% — full in 40m"
    text = payload["markdown"]["text"]
    assert text.startswith("# gpu-07 /root/autodl-tmp 96% — full in 40m\n/root/autodl-tmp is 96.1% full")
    assert "**Action taken:** cleanup freed 12 GiB" in text
    assert "**Next step:** Free space now" in text
    assert call["headers"]["Content-Type"] == "application/json"


def test_unsigned_robot_has_no_sign(dingtalk):
    calls, _ = dingtalk
    from trainguard.notify.messages import compose

    assert AppriseSender().send(target(f"dingtalk://{TOKEN}/"), compose("h", [event()])).ok
    assert set(parse_qs(urlsplit(calls[0]["url"]).query)) == {"access_token"}


def test_errcode_is_a_failure_and_is_retried(dingtalk, tmp_path):
    calls, answers = dingtalk
    answers.append((200, {"errcode": 310000, "errmsg": "sign not match"}))
    answers.append((200, {"errcode": 0, "errmsg": "ok"}))
    notify = config.parse({"notify": {"targets": [{"name": "robot", "url": f"dingtalk://{SECRET}@{TOKEN}/"}]}},
                          "t").notify
    now = [1_800_000_000.0]

    class Clock:
        def time(self):
            return now[0]

        def monotonic(self):
            return now[0]

    notifier = OutboxNotifier(StateDb(str(tmp_path)), notify, "gpu-07", clock=Clock(), random=lambda: 0.0,
                              start=False)
    worker = notifier.workers["robot"]
    notifier.notify([event()])
    next_at = worker.step()
    assert len(calls) == 1 and next_at == now[0] + 5.0
    error = notifier.outbox.conn.execute("SELECT last_error FROM outbox").fetchone()[0]
    assert "errcode=310000" in error and "sign not match" in error
    assert TOKEN not in error and SECRET not in error
    now[0] = next_at
    assert worker.step() is None
    assert len(calls) == 2
    assert notifier.outbox.conn.execute("SELECT state, attempts FROM outbox").fetchall() == [("delivered", 2)]
    notifier.close()


def test_http_error_is_a_failure(dingtalk):
    calls, answers = dingtalk
    answers.append((502, {"error": "bad gateway"}))
    from trainguard.notify.messages import compose

    delivery = AppriseSender().send(target(f"dingtalk://{TOKEN}/"), compose("h", [event()]))
    assert not delivery.ok and "502" in delivery.reason and TOKEN not in delivery.reason
