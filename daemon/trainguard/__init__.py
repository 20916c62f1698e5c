"""trainguard: keeps long GPU training runs alive."""

__version__ = "0.1.0"
