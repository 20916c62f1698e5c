"""What every command shares: exit codes, the --config/--state-dir options, loading the config."""

from __future__ import annotations

import argparse
import logging
import sys

from trainguard import config as configmod

EXIT_OK, EXIT_CRITICAL, EXIT_CONFIG = 0, 1, 2

log = logging.getLogger("trainguard")


def add_common(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--config", "-c", metavar="PATH", default=default,
                        help=f"config file (default: ${configmod.ENV_CONFIG}, else {configmod.DEFAULT_CONFIG_PATH} "
                             "if it exists, else built-in defaults)")
    parser.add_argument("--state-dir", metavar="DIR", default=default,
                        help="state database directory (default: general.state_dir)")


def quiet_logging() -> None:
    """One-off commands print their own output; only problems are logged, one line each."""
    logging.basicConfig(level=logging.WARNING, format="trainguard: %(message)s")


def load(args: argparse.Namespace, *, quiet: bool = False) -> configmod.Loaded | None:
    """The config, or None after one message on stderr. quiet: a one-off command's logging (see above)."""
    if quiet:
        quiet_logging()
    try:
        return configmod.load(getattr(args, "config", None))
    except configmod.ConfigError as exc:
        print(f"trainguard: invalid configuration:\n{exc}", file=sys.stderr)
        return None


def one_shot_reason(status: object) -> str:
    """The NVML state in words, without the daemon's "(retry in 10s)": a one-shot command does not retry."""
    import re

    message = (status.get("message") if isinstance(status, dict) else getattr(status, "message", "")) \
        or "GPU sampler off"
    return re.sub(r"\s*\(retry in [^)]*\)", "", message)
