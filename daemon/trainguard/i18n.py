"""Translations for the text people read (alerts, `status`), by gettext catalogs.

Strings are written in English in the code and marked: `N_("...")` where they are defined
(tables, templates), `tr(lang)("...")` where they are rendered. The catalogs live in
trainguard/locale/<lang>/LC_MESSAGES/trainguard.po, compiled to .mo by scripts/i18n.py
(see docs/i18n.md). Only the standard library's gettext is loaded at run time, and only
when a non-English language is asked for.
"""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from pathlib import Path
from typing import Callable

DOMAIN = "trainguard"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"

Gettext = Callable[[str], str]


def N_(message: str) -> str:
    """Marks a string for extraction; it is translated later, where it is rendered."""
    return message


def _same(message: str) -> str:
    return message


@lru_cache(maxsize=None)
def tr(lang: str | None) -> Gettext:
    """The gettext function for a language; English (and None) return the text unchanged."""
    if not lang or lang == "en":
        return _same
    import gettext

    return gettext.translation(DOMAIN, str(LOCALE_DIR), languages=[lang], fallback=True).gettext


def format_when(ts: float | None, tz: dt.tzinfo | None = None) -> str:
    """A wall time with an explicit offset: "2026-12-03 14:05 +08:00" ("CST" is ambiguous)."""
    if ts is None:
        return "-"
    t = dt.datetime.fromtimestamp(ts, tz) if tz is not None else dt.datetime.fromtimestamp(ts).astimezone()
    off = t.strftime("%z")
    return f"{t:%Y-%m-%d %H:%M} {off[:3]}:{off[3:]}"
