"""The one module that talks to apprise. apprise is imported on first use: it is heavy,
and the daemon must start and sample without it.

A delivery is a success only when apprise says so; on failure the reason comes from
apprise's own log records of that attempt (apprise.notify() returns just False).
apprise's log lines can contain the token of a URL it rejects, so they never reach
the log unfiltered: they are captured, redacted, and only then shown.

DingTalk gets its own sender class (a subclass of apprise's plugin): apprise's plugin
treats any HTTP 200 as delivered, but a DingTalk robot answers 200 with
{"errcode": 310000, "errmsg": "sign not match"} when it drops the message, and it
URL-encodes the HMAC signature twice. Here a non-zero errcode is a failure (retried)
and the signed URL is sent as DingTalk documents it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from trainguard.config import NotifyTarget
from trainguard.notify.messages import Message
from trainguard.records import AlertStatus, Severity
from trainguard.redact import Redactor, redact_url

log = logging.getLogger("trainguard.notify")

APPRISE_LOGGER = "apprise"
JSON_SCHEMES = frozenset({"json", "jsons"})
EMAIL_SCHEMES = frozenset({"mailto", "mailtos"})
DINGTALK_SCHEMES = frozenset({"dingtalk"})
# Services' own published limits, used when a target sets no rate_limit (messages per minute).
DEFAULT_RATE_LIMITS = {"dingtalk": 20, "wecombot": 20, "feishu": 100, "lark": 100}
_MAX_REASON = 300


@dataclass(frozen=True, slots=True)
class Delivery:
    ok: bool
    reason: str = ""  # why it failed, redacted; empty on success
    permanent: bool = False  # retrying cannot help (the URL itself is invalid)


def scheme_of(url: str) -> str:
    return url.partition("://")[0].lower()


def rate_limit_of(target: NotifyTarget) -> int:
    """Messages per minute for a target; 0 means unlimited."""
    return target.rate_limit or DEFAULT_RATE_LIMITS.get(scheme_of(target.url), 0)


class _Capture(logging.Handler):
    """Collects apprise's records emitted by one thread during one call."""

    def __init__(self, thread_id: int):
        super().__init__(logging.DEBUG)
        self.thread_id = thread_id
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread_id:
            self.records.append(record)


_apprise_lock = threading.Lock()
_apprise: Any = None


def _load_apprise() -> Any:
    """Import apprise once, and stop its records from reaching the root logger unredacted."""
    global _apprise
    with _apprise_lock:
        if _apprise is None:
            import apprise

            logger = logging.getLogger(APPRISE_LOGGER)
            logger.propagate = False
            logger.setLevel(logging.DEBUG)  # so the capture sees the socket errors apprise logs at debug
            if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
                logger.addHandler(logging.NullHandler())
            _apprise = apprise
        return _apprise


def _reason(records: list[logging.LogRecord], redactor: Redactor, fallback: str) -> str:
    """The most telling lines apprise logged: its warnings and errors, plus the socket error under them."""
    wanted = [r for r in records if r.levelno >= logging.WARNING]
    wanted += [r for r in records if r.levelno < logging.WARNING and
               any(word in r.getMessage() for word in ("Exception", "Response Details", "errcode"))]
    wanted.sort(key=lambda r: r.created)
    lines: list[str] = []
    for record in wanted:
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # a malformed record must not hide the failure itself
            continue
        if text and text not in lines:
            lines.append(text)
    reason = "; ".join(lines) or fallback
    reason = redactor(reason)
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


def _dingtalk_class(apprise: Any) -> type:
    import base64
    import hashlib
    import hmac
    import time
    from urllib.parse import quote_plus

    import requests
    from apprise.plugins.dingtalk import NotifyDingTalk

    class CheckedDingTalk(NotifyDingTalk):
        """apprise's DingTalk plugin, but a robot's errcode counts and the signature is encoded once."""

        def send(self, body: str, title: str = "", notify_type: Any = None, body_format: Any = None,
                 **kwargs: Any) -> bool:
            if body_format == apprise.NotifyFormat.MARKDOWN:
                heading = " ".join(title.split()).lstrip("#- ")
                payload: dict[str, Any] = {"msgtype": "markdown", "markdown": {
                    "title": heading or self.app_desc, "text": f"# {heading}\n{body}" if heading else body}}
            else:
                payload = {"msgtype": "text", "text": {"content": f"{title}\r\n{body}" if title else body}}
            payload["at"] = {"atMobiles": self.targets, "isAtAll": False}
            url = self.notify_url.format(token=self.token)
            if self.secret:
                timestamp = str(round(time.time() * 1000))
                digest = hmac.new(self.secret.encode(), f"{timestamp}\n{self.secret}".encode(), hashlib.sha256).digest()
                url += f"&timestamp={timestamp}&sign={quote_plus(base64.b64encode(digest).decode())}"
            self.throttle()
            try:
                r = requests.post(url, data=json.dumps(payload), headers={
                    "User-Agent": self.app_id, "Content-Type": "application/json"},
                    verify=self.verify_certificate, timeout=self.request_timeout, allow_redirects=self.redirects)
            except requests.RequestException as e:
                self.logger.warning(f"DingTalk connection error: {e}")
                return False
            if r.status_code != requests.codes.ok:
                self.logger.warning(f"DingTalk answered HTTP {r.status_code}: {(r.text or '')[:200]}")
                return False
            try:
                answer = r.json()
            except ValueError:
                self.logger.warning(f"DingTalk answered HTTP 200 with a body that is not JSON: {(r.text or '')[:200]}")
                return False
            errcode = answer.get("errcode", 0) if isinstance(answer, dict) else 0
            if errcode != 0:
                self.logger.warning(f"DingTalk rejected the message: errcode={errcode} "
                                    f"errmsg={answer.get('errmsg', '')}")
                return False
            self.logger.info("Sent DingTalk notification.")
            return True

    return CheckedDingTalk


class AppriseSender:
    """Sends one Message to one target through apprise; thread-safe, one attempt per call."""

    def __init__(self, redactor: Redactor | None = None):
        self.redactor = redactor or Redactor()
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str, float], Any] = {}

    def set_redactor(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def check(self, target: NotifyTarget) -> str | None:
        """None when apprise accepts the URL, else why not (redacted, naming the target)."""
        _service, problem = self._service(target)
        return problem

    def _service(self, target: NotifyTarget) -> tuple[Any, str | None]:
        cache_key = (target.name, target.url, target.timeout)
        with self._lock:
            if cache_key in self._services:
                return self._services[cache_key], None
        apprise = _load_apprise()
        capture = _Capture(threading.get_ident())
        logger = logging.getLogger(APPRISE_LOGGER)
        logger.addHandler(capture)
        try:
            service = self._instantiate(apprise, target)
        finally:
            logger.removeHandler(capture)
        if service is None:
            scheme = scheme_of(target.url)
            what = ("invalid apprise URL" if _scheme_registered(apprise, scheme)
                    else f"unknown apprise URL scheme {scheme!r}")
            detail = _reason(capture.records, Redactor([target.url]), "apprise could not parse it")
            return None, f"target {target.name!r}: {what} {redact_url(target.url)}: {detail}"
        problem = _address_problem(service)
        if problem:
            return None, f"target {target.name!r}: {problem} in {redact_url(target.url)}"
        with self._lock:
            self._services[cache_key] = service
        return service, None

    def _instantiate(self, apprise: Any, target: NotifyTarget) -> Any:
        asset = apprise.AppriseAsset(async_mode=False, storage_mode="memory")
        service = apprise.Apprise.instantiate(target.url, asset=asset)
        if service is None:
            return None
        scheme = scheme_of(target.url)
        if scheme in DINGTALK_SCHEMES:
            results = type(service).parse_url(target.url)
            if results is None:
                return None
            results["asset"] = asset
            service = _dingtalk_class(apprise)(**results)
        if scheme in EMAIL_SCHEMES and "format=" not in target.url:
            service.notify_format = apprise.NotifyFormat.TEXT  # plain text reads best in every mail client
        service.socket_connect_timeout = target.timeout
        service.socket_read_timeout = target.timeout
        return service

    def send(self, target: NotifyTarget, message: Message) -> Delivery:
        service, problem = self._service(target)
        if service is None:
            return Delivery(False, problem or "invalid URL", permanent=True)
        apprise = _load_apprise()
        scheme = scheme_of(target.url)
        formats = service.notify_format if isinstance(service.notify_format, tuple) else (service.notify_format,)
        if scheme in JSON_SCHEMES:
            body, body_format = message.text, apprise.NotifyFormat.TEXT
        elif scheme in EMAIL_SCHEMES:
            body, body_format = message.text, apprise.NotifyFormat.TEXT
        elif apprise.NotifyFormat.MARKDOWN in formats:
            body, body_format = message.markdown, apprise.NotifyFormat.MARKDOWN
        else:
            body, body_format = message.text, apprise.NotifyFormat.TEXT
        notify_type = _notify_type(apprise, message)
        capture = _Capture(threading.get_ident())
        logger = logging.getLogger(APPRISE_LOGGER)
        logger.addHandler(capture)
        try:
            with self._lock:  # one attempt per service object at a time (the JSON extras are per call)
                extras = None
                if scheme in JSON_SCHEMES and hasattr(service, "payload_extras"):
                    extras = dict(service.payload_extras)
                    service.payload_extras = {**extras, **message.payload}
                try:
                    ok = service.notify(body=body, title=message.title, notify_type=notify_type,
                                        body_format=body_format)
                finally:
                    if extras is not None:
                        service.payload_extras = extras
        except Exception as exc:  # a plugin bug is a failed attempt, not a dead worker
            ok = False
            capture.records.append(logging.makeLogRecord({"msg": f"{type(exc).__name__}: {exc}",
                                                          "levelno": logging.ERROR}))
        finally:
            logger.removeHandler(capture)
        if ok:
            return Delivery(True)
        return Delivery(False, _reason(capture.records, self.redactor, "apprise reported failure without a reason"))


def _address_problem(service: Any) -> str | None:
    """What apprise parses without checking: a port out of range (json://h:99999/ fails only at delivery),
    and a server host name that cannot be one. The host is not echoed: in a mistyped URL it may be a token."""
    port = getattr(service, "port", None)
    if port is not None and not 1 <= int(port) <= 65535:
        return f"port {port} is out of range (1-65535)"
    try:
        from apprise.utils.parse import is_hostname
    except ImportError:  # apprise 1.x
        from apprise.utils import is_hostname

    hosts = {"host": getattr(service, "host", None) if "host" in getattr(service, "template_tokens", {}) else None,
             "smtp": getattr(service, "smtp_host", None)}  # mailto's ?smtp= server
    for name, host in hosts.items():
        if host and not is_hostname(host, ipv4=True, ipv6=True):
            return f"its {name} is not a valid host name or address"
    return None


def _scheme_registered(apprise: Any, scheme: str) -> bool:
    try:
        from apprise.manager_plugins import NotificationManager

        return scheme in NotificationManager()
    except Exception:  # an apprise without the manager: only say "invalid"
        return True


def _notify_type(apprise: Any, message: Message) -> Any:
    if message.status is AlertStatus.RESOLVED:
        return apprise.NotifyType.SUCCESS
    return {Severity.CRITICAL: apprise.NotifyType.FAILURE,
            Severity.WARNING: apprise.NotifyType.WARNING}.get(message.severity, apprise.NotifyType.INFO)

