"""Read what a JSON webhook receiver got from trainguard, alert by alert.

trainguard posts one message per host and batch; its JSON payload lists every
alert in ``alerts``. Scenarios assert on those alerts: which ones arrived, when,
and that none arrived twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tests.support.http_receiver import HttpReceiver, RecordedRequest


@dataclass(frozen=True, slots=True)
class ReceivedAlert:
    key: str
    status: str  # firing / resolved
    severity: str
    summary: str
    repeat: bool
    started_at: str | None
    details: dict[str, Any]
    hint: str | None
    action_taken: str | None
    arrived_at: float  # the receiver's time.monotonic() when the message arrived
    title: str  # the message's title line
    text: str  # the message body a person reads

    @property
    def kind(self) -> str:
        """"fs.forecast" of "fs.forecast:/data"."""
        return self.key.split(":", 1)[0]

    @property
    def identity(self) -> tuple[str, str, str, str | None, bool]:
        """What makes a delivery a duplicate of another: same alert, same status and severity, same episode."""
        return (self.key, self.status, self.severity, self.started_at, self.repeat)


def alerts_of(request: RecordedRequest) -> list[ReceivedAlert]:
    body = request.json()
    if "trainguard" not in body:
        return []  # not one of ours (apprise's own test message, a stray client)
    return [ReceivedAlert(key=a["key"], status=a["status"], severity=a["severity"], summary=a["summary"],
                          repeat=bool(a.get("repeat")), started_at=a.get("started_at"),
                          details=a.get("details") or {}, hint=a.get("hint"), action_taken=a.get("action_taken"),
                          arrived_at=request.arrived_at, title=body.get("title", ""), text=body.get("message", ""))
            for a in body.get("alerts", [])]


def received(receiver: HttpReceiver) -> list[ReceivedAlert]:
    """Every alert delivered so far, in arrival order (only requests answered 2xx count)."""
    return [a for r in receiver.requests if 200 <= r.status < 300 for a in alerts_of(r)]


def find(alerts: list[ReceivedAlert], kind: str, status: str = "firing") -> list[ReceivedAlert]:
    return [a for a in alerts if a.kind == kind and a.status == status]


def duplicates(alerts: list[ReceivedAlert]) -> list[tuple]:
    """Alerts delivered more than once (same key, status, severity, episode, repeat flag)."""
    counts = Counter(a.identity for a in alerts)
    return [identity for identity, n in counts.items() if n > 1]


def describe(alerts: list[ReceivedAlert]) -> str:
    """One line per alert, for assertion messages."""
    return "\n".join(f"  {a.status:8} {a.severity:8} {a.key}: {a.summary}" for a in alerts) or "  (none)"
