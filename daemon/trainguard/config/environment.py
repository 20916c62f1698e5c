"""TRAINGUARD_* environment variables as config overrides, remembering which variable set which key.

`TRAINGUARD_<SECTION>__<KEY>=value` sets [section].key; `__` nests further. A value that looks like
JSON (`[...]`, `{...}`) is parsed, so lists and lists of tables work in a container:
`TRAINGUARD_NOTIFY__TARGETS='[{"name": "ops", "url": "dingtalk://..."}]'`,
`TRAINGUARD_CLEANUP='[{"name": "tmp", "type": "age"}]'`. A variable that cannot be a setting is an
error naming the variable, never silently ignored.

pydantic-settings would parse the same names, but costs ~80 ms and ~6 MiB of import here and cannot
say which variable a validation error came from; these few lines can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

ENV_PREFIX = "TRAINGUARD_"
ENV_CONFIG = "TRAINGUARD_CONFIG"
# TRAINGUARD_* variables that are not config keys: the config file, and the in-trainer guard's
# state directory and reserve (trainguard.guard reads those without loading any config).
RESERVED = frozenset({ENV_CONFIG, "TRAINGUARD_STATE_DIR", "TRAINGUARD_RESERVE"})
# Names are read in sorted order, so TRAINGUARD_GENERAL comes before TRAINGUARD_GENERAL__INTERVAL: a
# nested name below a whole-section value set as text is the conflict to report.


@dataclass
class EnvOverrides:
    tree: dict[str, Any] = field(default_factory=dict)
    origins: dict[tuple[str, ...], str] = field(default_factory=dict)  # key path -> variable name
    problems: list[tuple[str, str]] = field(default_factory=list)  # (variable, what is wrong)

    @property
    def variables(self) -> list[str]:
        return sorted(self.origins.values())

    def origin_of(self, loc: Iterable[Any]) -> str | None:
        """The variable that set this key path or a key above it (the longest match)."""
        path = tuple(str(p) for p in loc)
        for n in range(len(path), 0, -1):
            if path[:n] in self.origins:
                return self.origins[path[:n]]
        # The error is about a table the variables fill key by key (notify.targets from ..._TARGETS__0__URL).
        below = sorted(name for key, name in self.origins.items() if path and key[:len(path)] == path)
        return ", ".join(below) or None


def _value(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):
            pass  # left as text: validation says what is wrong with it
    return text


def read_env(environ: Mapping[str, str], sections: Iterable[str]) -> EnvOverrides:
    """Collect the overrides. `sections` are the top-level config keys (general, notify, cleanup ...)."""
    sections = frozenset(sections)
    out = EnvOverrides()
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in RESERVED:
            continue
        raw_parts = name[len(ENV_PREFIX):].split("__")
        parts = tuple(p.lower() for p in raw_parts)
        if not all(parts):
            out.problems.append((name, f"empty key between '__' separators; expected "
                                f"{ENV_PREFIX}<SECTION>__<KEY>, e.g. {ENV_PREFIX}GENERAL__INTERVAL=30s"))
            continue
        if parts[0] not in sections:
            hint = _hint(parts[0], sections)
            if len(parts) > 1 or hint:  # looks like a setting: a typo must not be ignored
                out.problems.append((name, f"not a setting ({parts[0]!r} is no config section{hint}); "
                                    f"sections: {', '.join(sorted(sections))}"))
            continue
        _place(out, name, parts, _value(environ[name]))
    return out


def _hint(first: str, sections: frozenset[str]) -> str:
    for section in sections:
        if first.startswith(section + "_"):
            return (f"; nested keys use a double underscore: "
                    f"{ENV_PREFIX}{section.upper()}__{first[len(section) + 1:].upper()}")
    return ""


def _place(out: EnvOverrides, name: str, parts: tuple[str, ...], value: Any) -> None:
    node = out.tree
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            other = out.origins.get(parts[:depth + 1], "another variable")
            out.problems.append((name, f"{'.'.join(parts[:depth + 1])} is already set as a whole by {other}; "
                                "use one or the other"))
            return
        node = child
    node[parts[-1]] = value
    out.origins[parts] = name
