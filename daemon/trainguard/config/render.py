"""The effective config written back as TOML, in the units a person writes ("6h", "20GiB", "90%").

`check-config` prints it, so what is shown can be pasted into a config file as it is.
"""

from __future__ import annotations

import json
from typing import Any, Mapping


def to_toml(data: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, (), data)
    return "\n".join(lines).strip() + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any], array: bool = False) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v) and not _is_table_list(v)}
    if path:
        lines.append("")
        name = ".".join(_key(p) for p in path)
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    for key, value in scalars.items():
        if value is not None:  # TOML has no null: an unset option is left out, as in a config file
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if _is_table(value):
            _table(lines, (*path, key), value)
        elif _is_table_list(value):
            for item in value:
                _table(lines, (*path, key), item, array=True)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() and key.isascii() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value if v is not None) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None) + "}"
    return json.dumps(str(value))
