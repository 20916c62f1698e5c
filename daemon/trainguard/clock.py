"""The clock is a parameter: wall time for timestamps, monotonic time for intervals."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...  # wall clock, seconds since the epoch (stored, shown)

    def monotonic(self) -> float: ...  # for intervals and timeouts: immune to clock jumps


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
