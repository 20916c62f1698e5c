"""The `trainguard` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Callable, Sequence

from trainguard import __version__
from trainguard import config as configmod

EXIT_OK, EXIT_CRITICAL, EXIT_CONFIG = 0, 1, 2

log = logging.getLogger("trainguard")


def _add_common(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--config", "-c", metavar="PATH", default=default,
                        help=f"config file (default: ${configmod.ENV_CONFIG}, else {configmod.DEFAULT_CONFIG_PATH} "
                             "if it exists, else built-in defaults)")
    parser.add_argument("--state-dir", metavar="DIR", default=default,
                        help="state database directory (default: general.state_dir)")


def quiet_logging() -> None:
    """One-off commands print their own output; only problems are logged, one line each."""
    logging.basicConfig(level=logging.WARNING, format="trainguard: %(message)s")


def _load(args: argparse.Namespace) -> configmod.Loaded | None:
    try:
        return configmod.load(getattr(args, "config", None))
    except configmod.ConfigError as exc:
        print(f"trainguard: invalid configuration:\n{exc}", file=sys.stderr)
        return None


def cmd_run(args: argparse.Namespace) -> int:
    import sqlite3

    from trainguard.service.daemon import Daemon
    from trainguard.service.logging_setup import setup_logging
    from trainguard.store.lock import LockHeld, StateLock
    from trainguard.store.state import StateDirError, choose_state_dir

    loaded = _load(args)
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
        result = daemon.cycle()
        daemon.close()
        for f in sorted(result.findings, key=lambda f: (-f.severity.rank, f.key)):
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


def cmd_status(args: argparse.Namespace) -> int:
    from trainguard.redact import scrub
    from trainguard.surfaces import status

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    doc = status.build(loaded.config, state_dir=args.state_dir)
    lang = loaded.config.notify.language
    if args.html:
        from trainguard.surfaces.status_page import render_page

        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(render_page(doc, lang))
    # Findings quote watched log lines, which may carry a token: status never shows one.
    print(scrub(json.dumps(doc, indent=2) if args.json else status.render(doc, lang)))
    return EXIT_OK


def _one_shot_reason(status: object) -> str:
    """The NVML state in words, without the daemon's "(retry in 10s)": a one-shot command does not retry."""
    import re

    message = getattr(status, "message", "") or "GPU sampler off"
    return re.sub(r"\s*\(retry in [^)]*\)", "", message)


def _no_gpu(args: argparse.Namespace, reason: str, code: int) -> int:
    if args.json:
        print(json.dumps({"gpus": [], "reason": reason}, indent=2))
    else:
        print(f"no GPU data: {reason}", file=sys.stderr)
    return code


def cmd_diagnose(args: argparse.Namespace) -> int:
    """What are the processes on a GPU doing? Runs the stall diagnosis now, stalled or not.

    Bounded, and touches no mount: no GPU answers at once; otherwise two NVML readings --wait apart
    (I/O counters moving or not), then the diagnosis at most its deadline (5 s). Mounts are not probed
    (a probe of a hung share would leave a stuck child behind); /proc names the blocked file and mount."""
    import time

    from trainguard.clock import SystemClock
    from trainguard.records import Snapshot
    from trainguard.sources.samplers import gpu_sampler

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    cfg = loaded.config
    sampler = gpu_sampler(cfg, SystemClock(), getattr(args, "nvml", None))
    if sampler is None:
        return _no_gpu(args, "GPU monitoring is disabled ([gpu] enabled = false)", EXIT_CONFIG)
    sampler.xid_events = False  # one shot: no XID listener thread to start and join (0.5 s)
    logging.getLogger("trainguard.gpu").setLevel(logging.ERROR)  # printed once below, without "retry in"
    reading = sampler.sample()
    if not reading.gpus:
        sampler.close()
        return _no_gpu(args, _one_shot_reason(reading.status), EXIT_CRITICAL)
    from trainguard.diagnosis import (
        stall as diagnosis,  # only now: a host without a GPU need not load it
    )

    diagnoser = diagnosis.StallDiagnoser(cfg.general.proc_root, py_spy=cfg.gpu.py_spy)
    try:
        wanted = {g.index for g in reading.gpus if args.gpu is None or args.gpu in (str(g.index), g.uuid)}
        if not wanted:
            print(f"no GPU {args.gpu!r}; present: {', '.join(str(g.index) for g in reading.gpus)}", file=sys.stderr)
            return EXIT_CONFIG
        diagnoser.watch_inferred(reading.gpus)
        diagnoser.observe(Snapshot(ts=time.time(), gpus=reading.gpus))  # I/O counters now and after the wait
        time.sleep(args.wait)
        reading = sampler.sample()
        snapshot = Snapshot(ts=time.time(), gpus=reading.gpus, gpu_status=reading.status)
        results = diagnoser.diagnose_within([g for g in snapshot.gpus if g.index in wanted], snapshot)
    finally:
        diagnoser.close()
        sampler.close()
    if args.json:
        print(json.dumps({"gpus": [d.to_dict() for d in results], "reason": None}, indent=2))
    else:
        print("\n\n".join(diagnosis.render(d, cfg.notify.language) for d in results))
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    path = args.path or args.config
    try:
        loaded = configmod.load(path)
    except configmod.ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    problems = _check_targets(loaded.config.notify.targets)
    if problems:
        print("invalid configuration:\n" + "\n".join(f"{loaded.source}: notify.targets: {p}" for p in problems),
              file=sys.stderr)
        return EXIT_CONFIG
    effective = configmod.dump(loaded.config)
    if args.json:
        print(json.dumps({"valid": True, "sources": [loaded.source, *loaded.env_vars], "config": effective},
                         indent=2))
        return EXIT_OK
    from trainguard.config.render import to_toml

    print(f"# valid: {loaded.source}")
    print(f"# merged: {loaded.sources}")
    print(to_toml(effective), end="")
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    from trainguard.actions.cleanup.audit import AuditLog
    from trainguard.actions.cleanup.report import printable, summary_lines
    from trainguard.actions.cleanup.runner import CleanupRunner, Item
    from trainguard.store.state import StateDb, StateDirError, choose_state_dir
    from trainguard.units import format_bytes, format_duration

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    policies = list(loaded.config.cleanup)
    if args.policy:
        chosen = [p for p in policies if p.name == args.policy]
        if not chosen:
            known = ", ".join(p.name for p in policies) or "none configured"
            print(f"trainguard: no cleanup policy named {args.policy!r} (policies: {known})", file=sys.stderr)
            return EXIT_CONFIG
        if not chosen[0].enabled and not args.dry_run:
            print(f"trainguard: policy {args.policy!r} is disabled (enabled = false); "
                  "--dry-run shows what it would do", file=sys.stderr)
            return EXIT_CONFIG
    else:
        chosen = [p for p in policies if p.enabled]
        if not chosen:
            print("no enabled cleanup policies (see [[cleanup]] in config.example.toml)")
            return EXIT_OK
    audit = None
    if not args.dry_run:
        try:
            db = StateDb(choose_state_dir(args.state_dir or loaded.config.general.state_dir,
                                          explicit=bool(args.state_dir)))
        except StateDirError as exc:
            print(f"trainguard: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        audit = AuditLog(db.connect())
    runner = CleanupRunner(chosen, audit=audit, proc_root=loaded.config.general.proc_root,
                           mirrors=loaded.config.mirror)
    verb = "would delete" if args.dry_run else "deleted"

    def show(item: Item) -> None:
        kind = "dir " if item.unit else ""
        print(f"{verb} {kind}{printable(item.path)}  {format_bytes(item.bytes)}  age {format_duration(item.age_s)}  {item.reason}")

    status = EXIT_OK
    for policy in chosen:
        report = runner.run(policy, trigger="manual", dry_run=args.dry_run, on_item=show if args.verbose else None)
        print("\n".join(summary_lines(report)))
        if report.guard:
            status = EXIT_CRITICAL
    if audit is not None:
        audit.conn.close()
    return status


def cmd_mirror(args: argparse.Namespace) -> int:
    """Run the mirrors once now: exit 0 when everything is on the share, 1 with one line per reason otherwise."""
    from trainguard.actions.mirror.runner import MirrorRunner
    from trainguard.store.state import StateDb, choose_state_dir
    from trainguard.units import format_bytes

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    mirrors = list(loaded.config.mirror)
    chosen = [m for m in mirrors if m.name == args.name] if args.name else [m for m in mirrors if m.enabled]
    if args.name and not chosen:
        known = ", ".join(m.name for m in mirrors) or "none configured"
        print(f"trainguard: no mirror named {args.name!r} (mirrors: {known})", file=sys.stderr)
        return EXIT_CONFIG
    if not chosen:
        print("no enabled mirrors (see [[mirror]] in config.example.toml)")
        return EXIT_OK
    db = StateDb(choose_state_dir(args.state_dir or loaded.config.general.state_dir))
    status = EXIT_OK
    for mirror in chosen:
        conn = db.connect()
        try:
            runner = MirrorRunner.open(mirror, conn)
            before = runner.record.states()[0].bytes_total
            state = runner.run()
        finally:
            conn.close()
        copied = format_bytes(state.bytes_total - before)
        if state.pending_files or state.reason:
            status = EXIT_CRITICAL
            print(f"{mirror.name}: {state.pending_files} files ({format_bytes(state.pending_bytes)}) not on "
                  f"{mirror.dest}: {state.reason or 'not copied'} ({copied} copied)", file=sys.stderr)
        else:
            print(f"{mirror.name}: everything on {mirror.dest} ({copied} copied)")
    return status


def _check_targets(targets: Sequence[configmod.NotifyTarget]) -> list[str]:
    """Each URL as apprise reads it (unknown scheme, bad token), named by target and redacted."""
    if not targets:
        return []
    from trainguard.notify.apprise_sender import AppriseSender
    from trainguard.redact import Redactor

    sender = AppriseSender(Redactor(t.url for t in targets))
    return [p for p in (sender.check(t) for t in targets) if p]


def cmd_test_alert(args: argparse.Namespace) -> int:
    """Send a real message to each target now (not through the outbox) and say what happened."""
    import time

    from trainguard.notify.apprise_sender import AppriseSender
    from trainguard.notify.messages import compose
    from trainguard.notify.worker import below_floor
    from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
    from trainguard.redact import Redactor, redact_url

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    cfg = loaded.config
    targets = cfg.notify.targets
    if args.target:
        targets = [t for t in targets if t.name in args.target]
        unknown = sorted(set(args.target) - {t.name for t in targets})
        if unknown:
            names = ", ".join(repr(t.name) for t in cfg.notify.targets) or "none configured"
            print(f"trainguard: no notify target named {', '.join(map(repr, unknown))} (targets: {names})",
                  file=sys.stderr)
            return EXIT_CONFIG
    if not targets:
        print(f"trainguard: no notify targets in {loaded.source}; add a [[notify.targets]] table "
              "(see config.example.toml)", file=sys.stderr)
        return EXIT_CONFIG
    host = cfg.general.host
    severity = Severity(args.severity)
    now = time.time()
    finding = Finding(
        key="trainguard.test", severity=severity,
        summary=f"test alert from trainguard on {host}: if you can read this, delivery works",
        details={"host": host, "config": loaded.source, "sent_by": "trainguard test-alert"},
        hint="nothing to do; real alerts look like this one")
    events = [AlertEvent(AlertStatus.FIRING, finding, started_at=now, ts=now)]
    sender = AppriseSender(Redactor(t.url for t in cfg.notify.targets))
    failed = 0
    for target in targets:
        started = time.monotonic()
        delivery = sender.send(target, compose(host, events, cfg.notify.language_for(target)))
        took = time.monotonic() - started
        note = ""
        if below_floor(target, severity):
            note = f" (note: real {severity.value} alerts are not sent here: severity floor is {target.severity})"
        if delivery.ok:
            print(f"{target.name}: delivered in {took:.1f}s via {redact_url(target.url)}{note}")
        else:
            failed += 1
            print(f"{target.name}: FAILED via {redact_url(target.url)}: {delivery.reason}")
    return EXIT_CRITICAL if failed else EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    import time

    from trainguard.store import heartbeat as health
    from trainguard.store import state

    loaded = _load(args)
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
    _add_common(parser, None)
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {name: sub.add_parser(name, help=help_) for name, (help_, _) in COMMANDS.items()}
    for p in parsers.values():
        # Accepted after the command too; SUPPRESS keeps a value given before the command.
        _add_common(p, argparse.SUPPRESS)
    parsers["run"].add_argument("--once", action="store_true",
                                help="one full cycle, print the findings, exit 1 if any is critical")
    parsers["run"].add_argument("--log-file", metavar="PATH",
                                help="log to this file instead of stderr, rotated at 10 MiB (3 old files kept); "
                                     "for containers without systemd")
    parsers["status"].add_argument("--json", action="store_true", help="one JSON document (schema in README)")
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
