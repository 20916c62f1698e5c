"""What the person on call reads, and what never shows a secret."""

from __future__ import annotations

from trainguard.notify.messages import compose, finding_tags
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
from trainguard.redact import Redactor, redact_url

T0 = 1_800_000_000.0


def test_title_and_body_say_what_where_how_bad_what_was_done_and_what_next():
    f = Finding("fs.forecast:/root/autodl-tmp", Severity.CRITICAL, "/root/autodl-tmp 96.1% full, ~40m left",
                details={"mountpoint": "/root/autodl-tmp", "avail_bytes": 2 * 2**30, "used_ratio": 0.961,
                         "eta_seconds": 2400, "fill_bytes_per_second": 3 * 2**30 / 3600, "fitted_span_seconds": 7200,
                         "action_taken": "cleanup freed 12.0 GiB"})
    m = compose("gpu-07", [AlertEvent(AlertStatus.FIRING, f, started_at=T0, ts=T0)])
    assert m.title == "gpu-07 /root/autodl-tmp 96% — full in 40m"
    lines = m.text.splitlines()
    assert lines[0] == ("/root/autodl-tmp is 96.1% full with 2.0 GiB free and fills at 3.0 GiB/h: "
                        "full in about 40m.")  # what happened first, each quantity once
    assert lines[1].startswith("Why: The trend of the last 2h")
    assert lines[2] == "Action taken: cleanup freed 12.0 GiB"
    assert lines[3].startswith("Next step: Free space now: remove old checkpoints")
    assert "action taken:" not in m.text  # shown once, as the action, not as a raw fact


def test_resolved_says_how_long_it_lasted_and_no_next_step():
    f = Finding("fs.usage:/data", Severity.WARNING, "/data 88.0% full", hint="free space",
                details={"mountpoint": "/data", "used_ratio": 0.88, "avail_bytes": 12 * 2**30,
                         "size_bytes": 100 * 2**30, "used_bytes": 88 * 2**30})
    m = compose("gpu-07", [AlertEvent(AlertStatus.RESOLVED, f, started_at=T0, ts=T0 + 2 * 3600 + 300)])
    assert m.title == "gpu-07 /data disk space OK again after 2h05m"
    assert "Next step" not in m.text and m.payload["status"] == "resolved"
    assert m.payload["duration_seconds"] == 7500


def test_a_kind_without_renderer_keeps_the_detectors_text_and_facts():
    f = Finding("new.kind:x", Severity.WARNING, "x is odd", details={"free_bytes": 2 * 2**30}, hint="look at x")
    m = compose("h", [AlertEvent(AlertStatus.FIRING, f, started_at=T0, ts=T0)], lang="zh")
    assert m.title == "h x is odd"
    assert "free: 2.0 GiB" in m.text and "下一步：look at x" in m.text


def test_group_puts_the_worst_firing_alert_on_top():
    events = [AlertEvent(AlertStatus.RESOLVED, Finding("b", Severity.CRITICAL, "B"), T0, T0 + 60),
              AlertEvent(AlertStatus.FIRING, Finding("c", Severity.WARNING, "C"), T0, T0),
              AlertEvent(AlertStatus.FIRING, Finding("a", Severity.CRITICAL, "A"), T0, T0)]
    m = compose("h", events)
    assert m.title == "h A (+2 more)"
    assert [a["key"] for a in m.payload["alerts"]] == ["a", "c", "b"]
    assert m.payload["severity"] == "critical" and m.payload["count"] == 3
    assert m.text.index("[CRITICAL] A") < m.text.index("[WARNING] C") < m.text.index("[RESOLVED] B")


def test_tags_are_detector_family_and_labels():
    f = Finding("gpu.stall:0", Severity.WARNING, "x", labels={"gpu": "0"})
    assert finding_tags(f) == {"gpu.stall", "gpu", "gpu=0"}


def test_redacted_urls_keep_only_their_shape():
    assert redact_url("dingtalk://SECRETx@TOKENy/") == "dingtalk://***@***/"
    assert redact_url("dingtalk://TOKENy/") == "dingtalk://***/"
    assert redact_url("mailtos://me:p%40ss@smtp.example.com:587?to=a@b.c&mode=starttls") == \
        "mailtos://***@smtp.example.com:587?to=***&mode=starttls"
    assert redact_url("json://hooks.example.com/p/SECRETpath?token=SECRETq") == \
        "json://hooks.example.com/***?token=***"
    assert redact_url("not a url SECRET") == "***"


def test_redactor_scrubs_every_form_of_every_piece():
    r = Redactor(["mailtos://me:p%40ssword@smtp.example.com?to=a@b.c", "dingtalk://SECRETx@TOKENy/"])
    text = "login p@ssword / p%40ssword failed; token TOKENy, sign SECRETx; host smtp.example.com"
    out = r(text)
    for secret in ("p@ssword", "p%40ssword", "TOKENy", "SECRETx"):
        assert secret not in out
    assert "smtp.example.com" in out
