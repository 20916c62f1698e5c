"""Human units: what a person writes in the config parses to the number they meant, or is refused clearly."""

from __future__ import annotations

import math

import pytest
from trainguard.units import (
    format_bytes,
    format_duration,
    format_ratio,
    parse_bytes,
    parse_duration,
    parse_ratio,
)


@pytest.mark.parametrize("text, expected", [
    ("90%", 0.9), ("85.5%", 0.855), (" 100% ", 1.0), ("0%", 0.0), (0.9, 0.9), (1, 1.0), ("0.75", 0.75),
])
def test_ratio_accepts_percentages_and_ratios(text, expected):
    assert parse_ratio(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, says", [
    ("150%", "outside 0%..100%"), ("-1%", "outside 0%..100%"), (90, "outside 0%..100%"), (-0.1, "outside"),
    ("ninety", "not a percentage"), ("%", "not a percentage"), ("nan", "outside"), (True, "expected a percentage"),
    (None, "expected a percentage"),
])
def test_ratio_refuses_out_of_range_and_garbage(text, says):
    # 90 (meaning 90 %) is refused rather than guessed at: a silent 9000 % would never fire.
    with pytest.raises(ValueError, match=says):
        parse_ratio(text)


@pytest.mark.parametrize("text, expected", [
    ("50GiB", 50 * 2**30), ("50GB", 50 * 10**9), ("1.5 MiB", int(1.5 * 2**20)), ("512", 512), (4096, 4096),
    ("10k", 10_000), ("2tib", 2 * 2**40), (0, 0), (3.0, 3),
])
def test_bytes_binary_or_decimal_as_written(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-5GB", -1, "5 parsecs", "GB", 1.5, True, [1]])
def test_bytes_refuses_negative_unknown_units_and_fractions(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize("text, expected", [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("7d", 7 * 86400), ("500ms", 0.5), ("2w", 14 * 86400),
    ("1.5h", 5400), (" 6 h ", 21600), ("90", 90), (12, 12), (0.25, 0.25), ("5M", 300), ("1H5M10S", 3910),
])
def test_duration_parses_compound_human_forms(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, says", [
    ("-5", "negative"), (-1, "negative"), ("5 fortnights", "not a duration"), ("h", "not a duration"),
    ("5s garbage", "not a duration"), ("-5s", "not a duration"), (True, "expected a duration"),
    ("inf", "finite"), (math.inf, "finite"), ("nan", "finite"),
])
def test_duration_refuses_negative_infinite_and_garbage(text, says):
    # An infinite interval or `for` would silently turn a rule off.
    with pytest.raises(ValueError, match=says):
        parse_duration(text)


@pytest.mark.parametrize("n, shown", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB"), (3 * 2**50, "3072.0 TiB"),
])
def test_format_bytes_like_df_h(n, shown):
    assert format_bytes(n) == shown


@pytest.mark.parametrize("seconds, shown", [
    (None, "-"), (math.inf, "-"), (0, "0s"), (45.4, "45s"), (59.6, "1m"), (2400, "40m"), (3599.6, "1h"),
    (5 * 3600 + 12 * 60, "5h12m"), (3 * 86400 + 4 * 3600, "3d4h"), (2 * 86400, "2d"),
])
def test_format_duration_is_compact(seconds, shown):
    assert format_duration(seconds) == shown


def test_format_ratio():
    assert format_ratio(None) == "-"
    assert format_ratio(0.9612) == "96.1%"
