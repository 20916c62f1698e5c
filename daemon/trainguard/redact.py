"""Keeping secrets out of everything printed: notify URLs carry tokens and passwords.

apprise URLs hide secrets in every part: the user/password (mailtos://user:pass@host,
dingtalk://secret@token/), the "host" (dingtalk://token/, feishu://token/), the path
(discord://id/token) and the query (json://host/path?token=...). A URL is shown only
as its shape; free text (log lines, apprise's own messages, exceptions) is scrubbed
of every fragment of every configured URL.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote

MASK = "***"
# Query keys whose values shape the delivery rather than authenticate it.
_PLAIN_QUERY_KEYS = frozenset({"mode", "format", "method", "overflow", "verify", "cto", "rto", "smtp"})
_MIN_FRAGMENT = 3  # shorter pieces are not secrets worth hiding, and would mangle every line
_HOSTNAME = re.compile(r"^(localhost|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+)(:\d+)?$")


def _split(url: str) -> tuple[str, str, str, str, str] | None:
    """scheme, userinfo, host[:port], path, query -- or None when it is not scheme://..."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        return None
    rest, _, _fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    return scheme, (userinfo if at else ""), host, (slash + path), query


def _is_hostname(host: str) -> bool:
    """A real host name or address is not a secret; a bare word in the host slot is a token."""
    return bool(_HOSTNAME.match(host))


def redact_url(url: str) -> str:
    """dingtalk://secret@token/ -> dingtalk://***@***/ ; json://h:8080/hook?token=x -> json://h:8080/***?token=***."""
    parts = _split(url)
    if parts is None:
        return MASK
    scheme, userinfo, host, path, query = parts
    out = f"{scheme}://"
    if userinfo:
        out += f"{MASK}@"
    out += host if _is_hostname(host) else (MASK if host else "")
    if path:
        out += "/" if path.strip("/") == "" else f"/{MASK}" + ("/" if path.endswith("/") else "")
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        out += "?" + "&".join(f"{k}={v if k.lower() in _PLAIN_QUERY_KEYS else MASK}" for k, v in pairs)
    return out


def secret_fragments(url: str) -> set[str]:
    """Every piece of a URL that may be a secret, as written and decoded."""
    parts = _split(url)
    if parts is None:
        return {url} if len(url) >= _MIN_FRAGMENT else set()
    _scheme, userinfo, host, path, query = parts
    pieces: list[str] = []
    if userinfo:
        pieces.append(userinfo)
        pieces.extend(userinfo.split(":", 1))
    if host and not _is_hostname(host):
        pieces.append(host)
        pieces.append(host.rsplit(":", 1)[0])
    pieces.extend(p for p in path.split("/") if p)
    pieces.extend(v for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() not in _PLAIN_QUERY_KEYS)
    found: set[str] = set()
    for piece in pieces:
        for form in (piece, unquote(piece), quote(unquote(piece), safe=""), quote_plus(unquote(piece), safe="")):
            if len(form) >= _MIN_FRAGMENT:
                found.add(form)
    return found


class Redactor:
    """Replaces every secret fragment of the given URLs in a text with ***."""

    def __init__(self, urls: Iterable[str] = ()):
        fragments: set[str] = set()
        for url in urls:
            fragments |= secret_fragments(url)
        # Longest first, so "abc123@tok456" goes before its "abc123" would leave "***@tok456".
        ordered = sorted(fragments, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)


# Credentials wherever they turn up in free text: any scheme://... URL, and token-like query values.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://(?!\.\.\.)[^\s'\"<>()\[\]{},]+")
_TOKEN_IN_TEXT = re.compile(
    r"(?i)\b(access_token|token|secret|password|passwd|apikey|api_key|sign|signature)=([^&\s'\"]+)")


def scrub(text: str) -> str:
    """Mask what looks like a credential in any text: URLs shown by their shape, token=value as token=***."""
    if not text or ("://" not in text and "=" not in text):
        return text
    text = _URL_IN_TEXT.sub(lambda m: _scrub_url(m.group(0)), text)
    return _TOKEN_IN_TEXT.sub(lambda m: f"{m.group(1)}={MASK}", text)


def _scrub_url(url: str) -> str:
    """A plain web address keeps its host and path (http://127.0.0.1:9842/metrics is no secret) and loses
    its user:password; any other scheme is a notification URL whose every part may be a token."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() in ("http", "https"):
        netloc, slash, path = rest.partition("/")
        userinfo, at, host = netloc.rpartition("@")
        return f"{scheme}://{MASK + '@' if at else ''}{host}{slash}{path}"
    return redact_url(url)


def install_log_scrubber() -> None:
    """Scrub every log record of this process, whatever handler writes it (stderr, journal, a file)."""
    import logging

    previous = logging.getLogRecordFactory()
    if getattr(previous, "scrubs", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    factory.scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
