"""Human units in config and output: "90%", "50GiB", "30s", "7d".

Parsers accept what a person writes in a TOML file (or an env var) and return
plain numbers: ratios in 0..1, bytes as int, durations in seconds as float.
They raise ValueError with a message that says what is allowed; pydantic turns
that into one line per bad key.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
_BYTES_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_PART = re.compile(rf"{_NUMBER}\s*(ms|s|m|h|d|w)", re.IGNORECASE)


def parse_ratio(value: object) -> float:
    """ "90%" -> 0.9; 0.9 -> 0.9. Numbers above 1 are rejected, not guessed at."""
    if isinstance(value, bool):
        raise ValueError("expected a percentage like \"90%\" or a ratio like 0.9")
    if isinstance(value, (int, float)):
        ratio = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a percentage like \"90%\" or a ratio like 0.9") from None
    else:
        raise ValueError("expected a percentage like \"90%\" or a ratio like 0.9")
    if math.isnan(ratio) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{value!r} is outside 0%..100% (a ratio must be between 0 and 1)")
    return ratio


def parse_bytes(value: object) -> int:
    """ "50GiB" -> 50*2**30, "50GB" -> 50*10**9 (binary or decimal as written)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like \"50GiB\" or \"500MB\"")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a size must be >= 0")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _BYTES_RE.match(value)
        if match:
            unit = _BYTE_UNITS.get(match.group(2).lower())
            if unit is not None:
                return int(float(match.group(1)) * unit)
    raise ValueError(
        f"{value!r} is not a size; write a number with B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB (binary)"
    )


def parse_duration(value: object) -> float:
    """ "30s", "5m", "1h30m", "7d" -> seconds; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like \"30s\", \"5m\", \"7d\"")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(n + u for n, u in parts).lower() != text.lower():
                raise ValueError(f"{value!r} is not a duration; write e.g. \"500ms\", \"30s\", \"5m\", \"6h\", \"7d\"") from None
            seconds = sum(float(n) * _DURATION_UNITS[u.lower()] for n, u in parts)
    else:
        raise ValueError("expected a duration like \"30s\", \"5m\", \"7d\"")
    if not math.isfinite(seconds):
        # An infinite interval or `for` would silently switch a rule off.
        raise ValueError(f"{value!r} is not a finite duration; write e.g. \"30s\", \"5m\", \"7d\"")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative; a duration must be >= 0")
    return seconds


def format_bytes(n: float | None) -> str:
    """Binary units, as df -h shows them: 1.5 GiB."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float | None) -> str:
    """Compact, for people: 45s, 40m, 5h12m, 3d4h."""
    if seconds is None or math.isinf(seconds):
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m:02d}m" if m else f"{h}h"
    d, h = divmod(s // 3600, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def format_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r * 100:.1f}%"


def format_iso_utc(ts: float | None) -> str | None:
    """A wall-clock time for machines (JSON output, webhook payloads): ISO 8601 in UTC, to the second."""
    import datetime as dt  # here: the in-trainer guard imports this module and never formats a time

    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def format_duration_exact(seconds: float) -> str:
    """Lossless and as a person writes it in a config: 21600 -> "6h", 90 -> "90s", 0.5 -> "500ms"."""
    if seconds == 0:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    ms = seconds * 1000
    return f"{int(round(ms))}ms" if abs(ms - round(ms)) < 1e-9 else f"{seconds:g}s"


def format_bytes_exact(n: int) -> str:
    """Lossless: 20 * 2**30 -> "20GiB"; a size that is no whole binary unit stays a byte count."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


