"""What a person reads at 3 a.m., on a phone: alert events turned into one message per host.

Pure formatting, no I/O. The title is the host and the one fact ("gpu3 /data 96% — full in
2h", at most TITLE_MAX characters). The body leads with what happened, then why, what
trainguard already did, and the next step; times carry their zone offset. Texts come from
notify/texts.py in the target's language (gettext catalogs, docs/i18n.md). The markdown
body keeps to what DingTalk renders: headings, bold, lists, quotes, line breaks (no inline
code, no tables). The JSON payload carries the same facts as stable English fields.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trainguard.i18n import N_, Gettext, format_when, tr
from trainguard.notify.texts import Texts, plain, texts_for
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.units import format_bytes, format_duration, format_iso_utc, format_ratio

PAYLOAD_VERSION = 1
MAX_LISTED = 20  # a grouped message lists at most this many alerts in full; the rest as a count
TITLE_MAX = 60  # a phone's notification line
SEVERITY_WORDS = {"critical": N_("CRITICAL"), "warning": N_("WARNING"), "info": N_("INFO"),
                  "resolved": N_("RESOLVED")}


@dataclass(frozen=True, slots=True)
class Message:
    title: str  # one line: "gpu-07 /data 96% — full in 40m"
    text: str  # plain body (e-mail, plain-text services)
    markdown: str  # body for services that render markdown (DingTalk, ...)
    payload: Mapping[str, Any]  # JSON webhook fields
    severity: Severity  # the worst of the events
    status: AlertStatus  # firing if any event fires, else resolved
    language: str = "en"


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
            return format_when(value)
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
    """Structured details (the stall diagnosis, process lists) and long traces stay in the JSON payload."""
    if name == "action_taken" or isinstance(value, dict):
        return False
    if isinstance(value, (list, tuple)):
        return len(value) <= MAX_LIST_FACT and not any(isinstance(v, (dict, list, tuple)) for v in value)
    return True


def _facts(f: Finding) -> list[tuple[str, str]]:
    """The raw facts, shown for a finding without a renderer (its summary does not carry them all)."""
    return [(fact_label(name), format_detail(name, value)) for name, value in f.details.items()
            if _for_people(name, value)]


def fit(text: str, limit: int = TITLE_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _tag(event: AlertEvent, _: Gettext) -> str:
    word = "resolved" if event.status is AlertStatus.RESOLVED else event.finding.severity.value
    return _(SEVERITY_WORDS[word])


def _headline(event: AlertEvent, t: Texts, _: Gettext) -> str:
    """The one fact: the finding's, or for a resolved alert what recovered and how long it lasted."""
    if event.status is AlertStatus.RESOLVED:
        return _("{subject} OK again after {duration}").format(subject=t.subject,
                                                               duration=format_duration(event.duration_s))
    return t.fact


def _order(events: Sequence[AlertEvent]) -> list[AlertEvent]:
    """Firing before resolved, worst first, then by key: the top line is the most urgent."""
    return sorted(events, key=lambda e: (e.status is AlertStatus.RESOLVED, -e.finding.severity.rank, e.finding.key))


def _meta(event: AlertEvent, _: Gettext) -> str:
    """Severity, since when (with the zone offset), the alert's key: the small print."""
    if event.status is AlertStatus.RESOLVED:
        when = _("resolved {at}, since {since}").format(at=format_when(event.ts), since=format_when(event.started_at))
    elif event.repeat:
        when = _("still firing since {since}").format(since=format_when(event.started_at))
    else:
        when = _("since {since}").format(since=format_when(event.started_at))
    return f"{_tag(event, _)} · {when} · {event.finding.key}"


def _lines(event: AlertEvent, t: Texts, _: Gettext) -> list[tuple[str, str]]:
    """(label, text) in reading order: what happened, why, action taken, next step."""
    f = event.finding
    out = [("", t.what)]
    if event.status is AlertStatus.RESOLVED:
        out = [("", _("Back to normal. Last seen: {what}").format(what=t.what))]
    if t.fallback:
        out += [("", f"{name}: {value}") for name, value in _facts(f)]
    firing = event.status is AlertStatus.FIRING
    if t.why and firing:
        out.append((_("Why:"), t.why))
    if f.details.get("action_taken"):
        out.append((_("Action taken:"), str(f.details["action_taken"])))
    if t.step and firing:
        out.append((_("Next step:"), plain(t.step)))
    return out


def _labelled(label: str, text: str) -> str:
    """"Next step: x", "下一步：x" (a full-width colon carries its own space)."""
    if not label:
        return text
    return f"{label}{'' if label.rstrip('*').endswith('：') else ' '}{text}"


def _section_text(event: AlertEvent, t: Texts, _: Gettext, heading: str | None) -> list[str]:
    lines = [heading] if heading else []
    lines += [_labelled(label, text) for label, text in _lines(event, t, _)]
    return lines + [_meta(event, _), ""]


def _section_markdown(event: AlertEvent, t: Texts, _: Gettext, heading: str | None) -> list[str]:
    lines = [f"#### {heading}", ""] if heading else []
    for label, text in _lines(event, t, _):
        lines += [_labelled(f"**{label}**" if label else "", plain(text)), ""]
    return lines + [f"> {_meta(event, _)}", ""]


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


def compose(host: str, events: Sequence[AlertEvent], lang: str = "en") -> Message:
    """One message for one host's events (at least one), in the given language ("en", "zh")."""
    if not events:
        raise ValueError("compose() needs at least one event")
    _ = tr(lang)
    ordered = _order(events)
    texts = [texts_for(e.finding, _) for e in ordered]
    firing = [e for e in ordered if e.status is AlertStatus.FIRING]
    status = AlertStatus.FIRING if firing else AlertStatus.RESOLVED
    severity = max((e.finding.severity for e in (firing or ordered)), key=lambda s: s.rank)
    more = _(" (+{count} more)").format(count=len(ordered) - 1) if len(ordered) > 1 else ""
    title = fit(f"{host} {fit(_headline(ordered[0], texts[0], _), TITLE_MAX - len(host) - len(more) - 1)}{more}")
    listed, hidden = ordered[:MAX_LISTED], len(ordered) - MAX_LISTED

    text: list[str] = []
    markdown: list[str] = []
    grouped = len(ordered) > 1
    if grouped:
        counts = _("{count} alerts on {host}: {firing} firing, {resolved} resolved").format(
            count=len(ordered), host=host, firing=len(firing), resolved=len(ordered) - len(firing))
        text += [counts, ""]
        markdown += [f"**{counts}**", ""]
    for i, (event, t) in enumerate(zip(listed, texts), 1):
        heading = f"{i}. [{_tag(event, _)}] {_headline(event, t, _)}" if grouped else None
        text += _section_text(event, t, _, heading)
        markdown += _section_markdown(event, t, _, heading)
    if hidden > 0:
        more_line = _("… and {count} more: trainguard status on {host} lists them all").format(count=hidden, host=host)
        text.append(more_line)
        markdown.append(more_line)
    footer = _("— trainguard on {host}").format(host=host)
    text.append(footer)
    markdown.append(footer)

    alerts = [event_payload(host, e) for e in ordered]
    payload = {"trainguard": PAYLOAD_VERSION, **alerts[0], "severity": severity.value, "status": status.value,
               "count": len(alerts), "alerts": alerts}
    return Message(title=title, text="\n".join(text).strip(), markdown="\n".join(markdown).strip(),
                   payload=payload, severity=severity, status=status, language=lang)


def finding_tags(f: Finding) -> frozenset[str]:
    """What target `tags` route on: the detector ("fs.usage"), its family ("fs"), labels as name=value."""
    kind = f.kind
    return frozenset({kind, kind.split(".", 1)[0], *(f"{k}={v}" for k, v in f.labels.items())})


def owned_by(f: Finding, routes: Sequence[str]) -> bool:
    """Does any GPU process the finding names (details["owners"]) match one "key=value-or-glob" route?"""
    owners = [o for o in f.details.get("owners") or () if isinstance(o, Mapping)]
    for route in routes:
        key, _, pattern = route.partition("=")
        if any(key in o and fnmatch.fnmatchcase(str(o[key]), pattern) for o in owners):
            return True
    return False
