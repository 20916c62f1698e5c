"""Mirror patterns: globs relative to the source, where `**` spans directories (like rsync and .gitignore)."""

from __future__ import annotations

import re
from typing import Sequence


def _segment(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and part.find("]", i + 2) != -1:
            end = part.find("]", i + 2)
            body = part[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def translate(pattern: str) -> str:
    """A regex for a relative path: `**/` is zero or more directories, a trailing `**` anything below."""
    parts = pattern.strip("/").split("/")
    out = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_segment(part) + ("" if last else "/"))
    return "".join(out)


class Matcher:
    """Does a relative path match one of the patterns and none of the excludes?"""

    def __init__(self, patterns: Sequence[str], exclude: Sequence[str] = ()):
        self._include = re.compile("|".join(f"(?:{translate(p)})" for p in patterns), re.DOTALL)
        self._exclude = re.compile("|".join(f"(?:{translate(p)})" for p in exclude), re.DOTALL) if exclude else None

    def __call__(self, rel: str) -> bool:
        if self._include.fullmatch(rel) is None:
            return False
        return self._exclude is None or self._exclude.fullmatch(rel) is None
