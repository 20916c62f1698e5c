"""`trainguard run` (the daemon, or one cycle) and `trainguard health` (is the daemon cycling?)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from trainguard import __version__
from trainguard import config as configmod
from trainguard.cli.common import EXIT_CONFIG, EXIT_CRITICAL, EXIT_OK, load, log, one_shot_reason


def cmd_run(args: argparse.Namespace) -> int:
    import sqlite3

    from trainguard.service.daemon import Daemon
    from trainguard.service.logging_setup import setup_logging
    from trainguard.store.lock import LockHeld, StateLock
    from trainguard.store.state import StateDirError, choose_state_dir

    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    try:
        setup_logging(loaded.config.general.log_level, getattr(args, "log_file", None))
    except OSError as exc:
        print(f"trainguard: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        state_dir = choose_state_dir(args.state_dir or loaded.config.general.state_dir,
                                     explicit=bool(args.state_dir))
        lock = StateLock(state_dir)
        lock.acquire()
    except (StateDirError, LockHeld) as exc:
        print(f"trainguard: {exc}", file=sys.stderr)
        if getattr(args, "log_file", None):
            log.error("%s", exc)
        return EXIT_CONFIG
    early: list[int] = []  # SIGTERM/SIGINT while starting (NVML can take seconds): stop after the start, exit 0
    if not args.once:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda n, _f: early.append(n))
    try:
        try:
            daemon = Daemon(loaded, state_dir=state_dir, one_shot=args.once)
        except sqlite3.OperationalError as exc:  # a new database on a full or read-only disk
            print(f"trainguard: cannot open the state database in {state_dir}: {exc}; free space there or give "
                  "--state-dir on another disk", file=sys.stderr)
            return EXIT_CRITICAL
        return _run_locked(args, loaded, daemon, early)
    finally:
        lock.release()


def _run_locked(args: argparse.Namespace, loaded: configmod.Loaded, daemon, early: list[int]) -> int:
    if args.once:
        # One cycle must see a hung mount: wait for slow probes up to the timeout, as `status` does.
        daemon.samplers.fs.wait = loaded.config.filesystems.probe_timeout
        # The GPU state is printed once below, without the daemon's "(retry in 10s)": a one-shot does not retry.
        logging.getLogger("trainguard.gpu").setLevel(logging.WARNING)
        result = daemon.cycle()
        daemon.close()
        status = result.snapshot.gpu_status
        if status is not None and status.state.value not in ("ok", "off"):
            print(f"GPU: {one_shot_reason(status)}")
        cleanup = [e.finding for e in result.events if e.finding.key.startswith("cleanup.")]
        for f in sorted([*result.findings, *cleanup], key=lambda f: (-f.severity.rank, f.key)):
            print(f"[{f.severity.value.upper()}] {f.summary} ({f.key})")
        if not result.findings:
            print(f"no findings on {len(result.snapshot.filesystems)} filesystems")
        return EXIT_CRITICAL if any(f.severity.value == "critical" for f in result.findings) else EXIT_OK
    daemon.install_signal_handlers()
    if early:
        log.info("received %s while starting, stopping", signal.Signals(early[0]).name)
        daemon.stop_event.set()
    log.info("trainguard %s started: config %s, state %s, interval %gs, pid %d",
             __version__, loaded.source, daemon.state_dir, loaded.config.general.interval, os.getpid())
    daemon.run()
    log.info("stopped")
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    import time

    from trainguard.store import heartbeat as health
    from trainguard.store import state

    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    cfg = loaded.config
    state_dir = args.state_dir or cfg.general.state_dir
    if not os.path.exists(os.path.join(state_dir, state.DB_NAME)) and not args.state_dir:
        state_dir = state.fallback_state_dir()  # where a daemon without access to the configured dir writes
    max_age = args.max_age if args.max_age is not None else max(3 * cfg.general.interval, 60.0)
    result = health.check(state_dir, time.time(), max_age)
    print(result.message, file=sys.stdout if result.ok else sys.stderr)
    return EXIT_OK if result.ok else EXIT_CRITICAL

