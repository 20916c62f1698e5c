"""The pydantic types of config values: human units in, the same human form out ("90%", "20GiB", "6h").

The parsers and formatters themselves live in trainguard.units, which stays free of pydantic so the
in-trainer guard API can import it cheaply.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, PlainSerializer

from trainguard.units import (
    format_bytes_exact,
    format_duration_exact,
    parse_bytes,
    parse_duration,
    parse_ratio,
)

Ratio = Annotated[float, BeforeValidator(parse_ratio), PlainSerializer(lambda v: f"{v * 100:g}%", return_type=str)]
Bytes = Annotated[int, BeforeValidator(parse_bytes), PlainSerializer(format_bytes_exact, return_type=str)]
Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(format_duration_exact, return_type=str)]


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError('must be longer than 0s; write e.g. "500ms", "30s", "5m"')
    return seconds


# Intervals, timeouts and windows: zero would spin, never wait, or divide by nothing.
PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
