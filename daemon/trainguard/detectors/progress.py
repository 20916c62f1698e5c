"""A training run that stopped making progress (train.hang:<run>)."""

from __future__ import annotations

HANG_PREFIX = "train.hang:"  # the key of a run's hang finding: train.hang:<run>
