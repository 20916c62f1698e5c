"""The registry of renderers: what each kind of finding says to a person (notify/texts.py looks a
finding up here), and the small helpers the renderers share.

Each texts_* module registers its renderers with @renders(kind) when it is imported; this module
imports none of them, so the renderers depend on the registry and never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainguard.i18n import Gettext
from trainguard.records import Finding


@dataclass(frozen=True, slots=True)
class Texts:
    fact: str  # the one fact for the title: "/data 96% — full in 2h"
    subject: str  # what it is about, for "resolved" titles: "/data disk space"
    what: str  # what happened, with the numbers (one unit per quantity)
    why: str = ""  # why it matters or what caused it
    step: str = ""  # the next step
    fallback: bool = False  # no renderer for this finding: the detector's English text, and its raw facts


Renderer = Callable[[Finding, Gettext], Texts]
RENDERERS: dict[str, Renderer] = {}


def renders(*kinds: str) -> Callable[[Renderer], Renderer]:
    def register(fn: Renderer) -> Renderer:
        for kind in kinds:
            RENDERERS[kind] = fn
        return fn
    return register


def short_path(path: str, limit: int = 28) -> str:
    """A long path keeps its start and its last part: "/root/…/checkpoints"."""
    if len(path) <= limit:
        return path
    head, _, last = path.rpartition("/")
    last = last[-(limit - 6):]
    return f"{head[: max(limit - len(last) - 2, 1)]}…/{last}"


def pct(ratio: float | None) -> str:
    """Whole percent for titles: "96%"."""
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def plain(text: str) -> str:
    """DingTalk does not render inline code: commands stay as plain text."""
    return text.replace("`", "")
