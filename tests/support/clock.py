"""A clock for tests: wall time and monotonic time advance together, and the wall clock can jump on its own."""

from __future__ import annotations

import threading


class FakeClock:
    """Injected wherever the code takes a ``clock``; nothing global is patched.

    ``advance(s)`` moves both clocks (time passing); ``jump(s)`` moves only the wall clock, as an NTP step
    or an administrator's ``date -s`` does, while the monotonic clock keeps counting.
    """

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    def jump(self, seconds: float) -> None:
        with self._lock:
            self._wall += seconds
