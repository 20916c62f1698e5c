"""The `trainguard` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
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
    from trainguard.service.daemon import Daemon, setup_logging

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    setup_logging(loaded.config.general.log_level)
    daemon = Daemon(loaded, state_dir=args.state_dir)
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
    log.info("trainguard %s started: config %s, state %s, interval %gs",
             __version__, loaded.source, daemon.state_dir, loaded.config.general.interval)
    daemon.run()
    log.info("stopped")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from trainguard.surfaces import status

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    doc = status.build(loaded.config, state_dir=args.state_dir)
    print(json.dumps(doc, indent=2) if args.json else status.render(doc))
    return EXIT_OK


def cmd_diagnose(args: argparse.Namespace) -> int:
    """What are the processes on a GPU doing? Runs the stall diagnosis now, stalled or not."""
    import time

    from trainguard.clock import SystemClock
    from trainguard.diagnosis import stall as diagnosis
    from trainguard.records import Snapshot
    from trainguard.sources.samplers import Samplers

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    quiet_logging()
    cfg = loaded.config
    samplers = Samplers.from_config(cfg, SystemClock(), nvml=getattr(args, "nvml", None))
    if samplers.gpu is None:
        print("GPU monitoring is disabled ([gpu] enabled = false)", file=sys.stderr)
        return EXIT_CONFIG
    diagnoser = diagnosis.StallDiagnoser(cfg.general.proc_root, py_spy=cfg.gpu.py_spy)
    try:
        first = samplers.sample(time.time())
        diagnoser.observe(first)  # I/O counters now and after the wait show whether they move
        time.sleep(args.wait)
        snapshot = samplers.sample(time.time())
    finally:
        samplers.close()
    if not snapshot.gpus:
        status = snapshot.gpu_status
        print(f"no GPU data: {status.message if status else 'GPU sampler off'}", file=sys.stderr)
        return EXIT_CRITICAL
    gpus = [g for g in snapshot.gpus if args.gpu is None or str(g.index) == args.gpu or g.uuid == args.gpu]
    if not gpus:
        print(f"no GPU {args.gpu!r}; present: {', '.join(str(g.index) for g in snapshot.gpus)}", file=sys.stderr)
        return EXIT_CONFIG
    snapshot = Snapshot(ts=snapshot.ts, filesystems=first.filesystems, gpus=snapshot.gpus,
                        gpu_status=snapshot.gpu_status, log_matches=snapshot.log_matches)
    results = [diagnoser.diagnose(g, snapshot, util_recent=[u for u in (g.util_ratio,) if u is not None])
               for g in gpus]
    if args.json:
        print(json.dumps([d.to_dict() for d in results], indent=2))
    else:
        print("\n\n".join(diagnosis.render(d) for d in results))
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
    print(f"# valid: {loaded.source}")
    print(json.dumps(configmod.dump(loaded.config), indent=2))
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    from trainguard.actions.audit import AuditLog
    from trainguard.actions.cleanup import CleanupRunner, Item
    from trainguard.actions.report import printable, summary_lines
    from trainguard.store.state import StateDb, choose_state_dir
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
        db = StateDb(choose_state_dir(args.state_dir or loaded.config.general.state_dir))
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
    message = compose(host, [AlertEvent(AlertStatus.FIRING, finding, started_at=now, ts=now)])
    sender = AppriseSender(Redactor(t.url for t in cfg.notify.targets))
    failed = 0
    for target in targets:
        started = time.monotonic()
        delivery = sender.send(target, message)
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
    parsers["status"].add_argument("--json", action="store_true", help="one JSON document (schema in README)")
    parsers["check-config"].add_argument("path", nargs="?", help="config file to check")
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
    parsers["health"].add_argument("--max-age", type=float, metavar="SECONDS",
                                   help="oldest acceptable last cycle (default: 3 intervals, at least 60 s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except BrokenPipeError:  # `trainguard status | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
