"""What a person reads at 3 a.m.: alert events turned into one message per host.

Pure formatting, no I/O. A message says what, where, how bad (the title), the
facts, what trainguard already did ("Action taken"), and what to do next. Several
events for the same host become one message; a resolved event says how long it
lasted. The JSON payload carries the same facts as stable machine-readable fields.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.units import format_bytes, format_duration, format_iso_utc, format_ratio

PAYLOAD_VERSION = 1
MAX_LISTED = 20  # a grouped message lists at most this many alerts in full; the rest as a count


@dataclass(frozen=True, slots=True)
class Message:
    title: str  # one line: "[CRITICAL] gpu-07: /data 96.1% full, ~40m left"
    text: str  # plain body (e-mail, plain-text services)
    markdown: str  # body for services that render markdown (DingTalk, ...)
    payload: Mapping[str, Any]  # JSON webhook fields
    severity: Severity  # the worst of the events
    status: AlertStatus  # firing if any event fires, else resolved


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def format_detail(name: str, value: Any) -> str:
    """Human units by the naming convention of detail keys
    (_bytes, _ratio, _seconds or _s, _per_s, _since or _at for wall times)."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, (int, float)):
        if name.endswith(("_bytes_per_s", "_bytes_per_second")):
            return f"{format_bytes(value)}/s"
        if name.endswith("_bytes"):
            return format_bytes(value)
        if name.endswith("_ratio"):
            return format_ratio(value)
        if name.endswith(("_seconds", "_s")):
            return format_duration(value)
        if name.endswith(("_since", "_at")):
            return _when(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


_UNIT_SUFFIXES = ("_bytes_per_second", "_bytes_per_s", "_bytes", "_ratio", "_seconds", "_s")
MAX_LIST_FACT = 8  # longer lists (utilisation traces) are for JSON receivers, not a phone screen


def fact_label(name: str) -> str:
    """"eta_seconds" -> "eta": the value already carries its unit ("40m")."""
    for suffix in _UNIT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)] + ("/s" if "per" in suffix else "")
            break
    return name.replace("_", " ")


def _for_people(name: str, value: Any) -> bool:
    """Structured details (the stall diagnosis, process lists) and long traces stay in the JSON payload;
    the person reads their gist in the summary and the verdict."""
    if name == "action_taken" or isinstance(value, dict):
        return False
    if isinstance(value, (list, tuple)):
        return len(value) <= MAX_LIST_FACT and not any(isinstance(v, (dict, list, tuple)) for v in value)
    return True


def _facts(f: Finding) -> list[tuple[str, str]]:
    return [(fact_label(name), format_detail(name, value)) for name, value in f.details.items()
            if _for_people(name, value)]


def _headline(event: AlertEvent) -> str:
    f = event.finding
    if event.status is AlertStatus.RESOLVED:
        return f"{f.summary} — resolved after {format_duration(event.duration_s)}"
    return f.summary


def _tag(event: AlertEvent) -> str:
    return "RESOLVED" if event.status is AlertStatus.RESOLVED else event.finding.severity.value.upper()


def _order(events: Sequence[AlertEvent]) -> list[AlertEvent]:
    """Firing before resolved, worst first, then by key: the top line is the most urgent."""
    return sorted(events, key=lambda e: (e.status is AlertStatus.RESOLVED, -e.finding.severity.rank, e.finding.key))


def _status_line(event: AlertEvent) -> str:
    if event.status is AlertStatus.RESOLVED:
        return (f"Resolved at {_when(event.ts)}; it lasted {format_duration(event.duration_s)} "
                f"(since {_when(event.started_at)})")
    if event.repeat:
        return f"Still firing since {_when(event.started_at)} ({format_duration(event.duration_s)})"
    return f"Firing since {_when(event.started_at)}"


def event_payload(host: str, event: AlertEvent) -> dict[str, Any]:
    f = event.finding
    return {
        "host": host, "key": f.key, "severity": f.severity.value, "status": event.status.value,
        "summary": f.summary, "details": dict(f.details), "labels": dict(f.labels),
        "started_at": format_iso_utc(event.started_at), "ts": format_iso_utc(event.ts),
        "duration_seconds": round(event.duration_s, 1) if event.status is AlertStatus.RESOLVED else None,
        "value": f.value, "threshold": f.threshold, "repeat": event.repeat,
        "action_taken": f.details.get("action_taken"), "hint": f.hint or None,
    }


def _section_text(event: AlertEvent, numbered: str = "") -> list[str]:
    f = event.finding
    lines = [f"{numbered}[{_tag(event)}] {_headline(event)}", _status_line(event)]
    lines += [f"  {name}: {value}" for name, value in _facts(f)]
    if f.details.get("action_taken"):
        lines.append(f"Action taken: {f.details['action_taken']}")
    if f.hint and event.status is AlertStatus.FIRING:
        lines.append(f"Next step: {f.hint}")
    lines.append(f"({f.key})")
    return lines


def _section_markdown(event: AlertEvent) -> list[str]:
    f = event.finding
    lines = [f"### [{_tag(event)}] {_headline(event)}", "", f"- {_status_line(event)}"]
    lines += [f"- {name}: **{value}**" for name, value in _facts(f)]
    if f.details.get("action_taken"):
        lines.append(f"- **Action taken:** {f.details['action_taken']}")
    if f.hint and event.status is AlertStatus.FIRING:
        lines.append(f"- **Next step:** {f.hint}")
    lines += [f"- key: `{f.key}`", ""]
    return lines


def compose(host: str, events: Sequence[AlertEvent]) -> Message:
    """One message for one host's events (at least one)."""
    if not events:
        raise ValueError("compose() needs at least one event")
    ordered = _order(events)
    top = ordered[0]
    firing = [e for e in ordered if e.status is AlertStatus.FIRING]
    status = AlertStatus.FIRING if firing else AlertStatus.RESOLVED
    severity = max((e.finding.severity for e in (firing or ordered)), key=lambda s: s.rank)
    title = f"[{_tag(top)}] {host}: {_headline(top)}"
    if len(ordered) > 1:
        title += f" (+{len(ordered) - 1} more)"
    listed, hidden = ordered[:MAX_LISTED], len(ordered) - MAX_LISTED

    text: list[str] = []
    markdown: list[str] = []
    if len(ordered) > 1:
        counts = f"{len(firing)} firing, {len(ordered) - len(firing)} resolved"
        text += [f"{len(ordered)} alerts on {host} ({counts}).", ""]
        markdown += [f"**{len(ordered)} alerts on {host}** ({counts})", ""]
    for i, event in enumerate(listed, 1):
        text += _section_text(event, f"{i}. " if len(ordered) > 1 else "") + [""]
        markdown += _section_markdown(event)
    if hidden > 0:
        text.append(f"... and {hidden} more (trainguard status on {host} lists them all)")
        markdown.append(f"... and {hidden} more (`trainguard status` on {host} lists them all)")
    text.append(f"— trainguard on {host}")
    markdown.append(f"— trainguard on {host}")

    alerts = [event_payload(host, e) for e in ordered]
    payload = {"trainguard": PAYLOAD_VERSION, **alerts[0], "severity": severity.value, "status": status.value,
               "count": len(alerts), "alerts": alerts}
    return Message(title=title, text="\n".join(text).strip(), markdown="\n".join(markdown).strip(),
                   payload=payload, severity=severity, status=status)


def finding_tags(f: Finding) -> frozenset[str]:
    """What target `tags` route on: the detector ("fs.usage"), its family ("fs"), labels as name=value."""
    kind = f.kind
    return frozenset({kind, kind.split(".", 1)[0], *(f"{k}={v}" for k, v in f.labels.items())})
