"""What the benchmarks that build a Daemon in their own process share (import after daemon/ is on sys.path)."""

from __future__ import annotations

from trainguard.clock import SystemClock


class SteppedClock(SystemClock):
    """Real time plus `offset`; a benchmark adds 10 s per cycle it runs back to back, so history grows
    one point per series per cycle, as at the default interval."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset

    def monotonic(self) -> float:
        return super().monotonic() + self.offset


class Quiet:
    """A notifier that drops every event: a benchmark measures the cycle, not a delivery."""

    def notify(self, events):
        pass

    def close(self):
        pass
