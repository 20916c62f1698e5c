"""Environments for real child processes whose /proc/PID/environ the owner read cuts at a chosen byte.

The kernel writes /proc/PID/environ as the execve() environment, in order, each entry ended by a NUL;
subprocess passes a dict's items in order. So filler variables in front of a key move that key to
any offset. One string may be at most 128 KiB (MAX_ARG_STRLEN): the filler comes in several variables.
"""

from __future__ import annotations

import os

from trainguard.sources.owner import ENVIRON_LIMIT

_CHUNK = 100_000  # bytes of one filler entry, well under MAX_ARG_STRLEN


def _size(env: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())


def cut_inside(key: str, value: str, keep: int, before: dict[str, str] | None = None) -> dict[str, str]:
    """PATH, `before`, filler, then key=value, so that the first ENVIRON_LIMIT bytes of the environment
    end with key=value[:keep] (no NUL): the cut falls inside the value."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(before or {})}
    missing = ENVIRON_LIMIT - _size(env) - len(f"{key}={value[:keep]}".encode())
    i = 0
    while missing > 0:
        name = f"FILLER_{i}"
        n = missing - len(name) - 2  # "=" and the NUL
        if n > _CHUNK:
            n = min(_CHUNK, n - 32)  # and leave room for the next filler's name
        env[name] = "x" * n
        missing -= n + len(name) + 2
        i += 1
    assert missing == 0, "the filler could not end exactly where the key starts"
    env[key] = value
    return env
