"""E-mail through a real SMTP server on 127.0.0.1: plain, and STARTTLS with a login."""

from __future__ import annotations

import time

import pytest
from trainguard import config
from trainguard.notify.apprise_sender import AppriseSender
from trainguard.notify.messages import compose
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity

from tests.support.smtp_server import SmtpServer, openssl_reason, self_signed


def alert() -> list[AlertEvent]:
    now = time.time()
    f = Finding("fs.usage:/data", Severity.CRITICAL, "/data 96.1% full, 2.0 GiB free",
                details={"mountpoint": "/data", "used_ratio": 0.961}, hint="delete old checkpoints")
    return [AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now)]


def target(url: str) -> config.NotifyTarget:
    return config.parse({"notify": {"targets": [{"name": "mail", "url": url}]}}, "t").notify.targets[0]


def test_plain_smtp_mail_has_subject_body_and_recipients():
    with SmtpServer() as server:
        url = (f"mailto://example.com:{server.port}?smtp=127.0.0.1&mode=insecure"
               "&from=trainguard@example.com&to=ops@example.com,oncall@example.com")
        delivery = AppriseSender().send(target(url), compose("gpu-07", alert()))
        assert delivery.ok, delivery.reason
        mails = server.wait_for(2)
    assert sorted(r for m in mails for r in m.rcpt_tos) == ["oncall@example.com", "ops@example.com"]
    mail = mails[0]
    assert mail.mail_from == "trainguard@example.com" and not mail.tls
    assert mail.subject == "gpu-07 /data 96.1% full, 2.0 GiB free"
    assert mail.message.get_content_type() == "text/plain"
    assert "used: 96.1%" in mail.body and "Next step: delete old checkpoints" in mail.body


def test_starttls_with_login(tmp_path):
    if reason := openssl_reason():
        pytest.skip(reason)
    cert = self_signed(tmp_path)
    with SmtpServer(starttls_cert=cert, user="alerts", password="s3cret-pass") as server:
        url = (f"mailtos://alerts:s3cret-pass@example.com:{server.port}?smtp=127.0.0.1&mode=starttls&verify=no"
               "&from=trainguard@example.com&to=ops@example.com")
        delivery = AppriseSender().send(target(url), compose("gpu-07", alert()))
        assert delivery.ok, delivery.reason
        (mail,) = server.wait_for(1)
    assert mail.tls and mail.login == "alerts"
    assert mail.rcpt_tos == ("ops@example.com",)
    assert mail.subject.startswith("gpu-07 /data")


def test_wrong_password_is_a_failure_with_a_reason_and_no_secret(tmp_path):
    if reason := openssl_reason():
        pytest.skip(reason)
    cert = self_signed(tmp_path)
    with SmtpServer(starttls_cert=cert, user="alerts", password="right-one") as server:
        url = (f"mailtos://alerts:wrong-pass-123@example.com:{server.port}?smtp=127.0.0.1&mode=starttls&verify=no"
               "&from=trainguard@example.com&to=ops@example.com")
        sender = AppriseSender()
        from trainguard.redact import Redactor

        sender.set_redactor(Redactor([url]))
        delivery = sender.send(target(url), compose("gpu-07", alert()))
    assert not delivery.ok
    assert delivery.reason and "wrong-pass-123" not in delivery.reason
