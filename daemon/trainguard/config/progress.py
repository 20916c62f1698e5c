"""[progress]: the per-run progress watchdog (train.hang)."""

from __future__ import annotations

from pydantic import Field

from trainguard.config.base import Strict
from trainguard.config.types import PositiveDuration


class Progress(Strict):
    """A run is hung when it has been silent longer than max(min_silence, factor x its longest normal
    gap) (before its first progress: startup_grace), and its GPUs (or, without them, its processes)
    agree. The defaults sit under PyTorch's collective timeout (NCCL 10 min, gloo 30 min) for steady
    runs and learn the rest; see docs/progress.md."""

    enabled: bool = True
    factor: float = Field(3.0, ge=1.0)
    min_silence: PositiveDuration = 300.0
    startup_grace: PositiveDuration = 1800.0
