"""The `trainguard` command: one module per family of subcommands, the parser and main() here."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from trainguard import __version__
from trainguard.cli.actions import cmd_cleanup, cmd_mirror
from trainguard.cli.checks import cmd_check_config, cmd_test_alert
from trainguard.cli.common import EXIT_CONFIG, EXIT_CRITICAL, EXIT_OK, add_common
from trainguard.cli.run import cmd_health, cmd_run
from trainguard.cli.status import cmd_diagnose, cmd_status

__all__ = ["COMMANDS", "EXIT_CONFIG", "EXIT_CRITICAL", "EXIT_OK", "build_parser", "main"]

COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "run": ("run the daemon (or one cycle with --once)", cmd_run),
    "status": ("sample now and show mounts, trends and findings", cmd_status),
    "check-config": ("validate a config file and print the effective config", cmd_check_config),
    "diagnose": ("show what the processes on a GPU are doing or blocked on", cmd_diagnose),
    "cleanup": ("run the cleanup policies once now (--dry-run: only list what would go)", cmd_cleanup),
    "test-alert": ("send a test message to each notify target and report delivered / failed", cmd_test_alert),
    "mirror": ("copy new and changed files of the mirrors to the share once now; exit 1 if some are not", cmd_mirror),
    "health": ("exit 0 when the running daemon completed a cycle recently (container health checks)", cmd_health),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainguard", description="Keeps long GPU training runs alive.")
    add_common(parser, None)
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {name: sub.add_parser(name, help=help_) for name, (help_, _) in COMMANDS.items()}
    for p in parsers.values():
        # Accepted after the command too; SUPPRESS keeps a value given before the command.
        add_common(p, argparse.SUPPRESS)
    parsers["run"].add_argument("--once", action="store_true",
                                help="one full cycle, print the findings, exit 1 if any is critical")
    parsers["run"].add_argument("--log-file", metavar="PATH",
                                help="log to this file instead of stderr, rotated at 10 MiB (3 old files kept); "
                                     "for containers without systemd")
    parsers["status"].add_argument("--json", action="store_true", help="one JSON document (schema in docs/status-json.md)")
    parsers["status"].add_argument("--html", metavar="FILE", help="also write a self-contained page drawing "
                                   "each mount's use over 24 h, the forecast and the alerts")
    parsers["check-config"].add_argument("path", nargs="?", help="config file to check")
    parsers["check-config"].add_argument("--json", action="store_true",
                                         help="print the sources and the effective config as JSON")
    parsers["diagnose"].add_argument("gpu", nargs="?", help="GPU index or UUID (default: every GPU)")
    parsers["diagnose"].add_argument("--json", action="store_true", help="the diagnosis as JSON")
    parsers["diagnose"].add_argument("--wait", type=float, default=2.0, metavar="SECONDS",
                                     help="time between the two readings that show whether I/O moves (default 2)")
    parsers["cleanup"].add_argument("--dry-run", action="store_true",
                                    help="list what would be deleted, why, and the bytes; touch nothing")
    parsers["cleanup"].add_argument("--policy", metavar="NAME", help="only this policy (by its name)")
    parsers["cleanup"].add_argument("--verbose", "-v", action="store_true",
                                    help="one line per file or unit (default: a summary per policy)")
    parsers["test-alert"].add_argument("--target", "-t", action="append", metavar="NAME",
                                       help="only this target (repeat for more; default: all)")
    parsers["test-alert"].add_argument("--severity", choices=["info", "warning", "critical"], default="warning",
                                       help="severity of the test message (default: warning)")
    parsers["mirror"].add_argument("--once", action="store_true",
                                   help="run each mirror once and exit (the default; the daemon runs them on their "
                                        "schedule)")
    parsers["mirror"].add_argument("name", nargs="?", help="only this mirror (by its name; may be disabled)")
    parsers["health"].add_argument("--max-age", type=float, metavar="SECONDS",
                                   help="oldest acceptable last cycle (default: 3 intervals, at least 60 s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from trainguard.redact import install_log_scrubber

    parser = build_parser()
    args = parser.parse_args(argv)
    install_log_scrubber()  # no log line shows a credential, wherever it came from
    try:
        return COMMANDS[args.command][1](args)
    except BrokenPipeError:  # `trainguard status | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
