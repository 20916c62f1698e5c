"""`trainguard cleanup` and `trainguard mirror`: run the actions once now, by hand."""

from __future__ import annotations

import argparse
import signal
import sys

from trainguard.cli.common import EXIT_CONFIG, EXIT_CRITICAL, EXIT_OK, load


def cmd_cleanup(args: argparse.Namespace) -> int:
    from trainguard.actions.cleanup.record.audit import AuditLog
    from trainguard.actions.cleanup.record.report import printable, summary_lines, watermark_now
    from trainguard.actions.cleanup.runner import CleanupRunner, Item
    from trainguard.store.state import SCHEMA, StateDb, StateDirError, choose_state_dir
    from trainguard.units import format_bytes, format_duration

    loaded = load(args, quiet=True)
    if loaded is None:
        return EXIT_CONFIG
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
                                          explicit=bool(args.state_dir)), check=SCHEMA)
        except StateDirError as exc:
            print(f"trainguard: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        audit = AuditLog(db.connect(), retention=loaded.config.history.audit_retention)
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
        if args.dry_run and policy.watermark and policy.schedule is not None:  # that was its scheduled run
            now = runner.run(policy.model_copy(update={"schedule": None}), trigger="manual", dry_run=True)
            print("  " + watermark_now(now))
        if report.guard:
            status = EXIT_CRITICAL
    if audit is not None:
        audit.conn.close()
    return status


def cmd_mirror(args: argparse.Namespace) -> int:
    """Run the mirrors once now: exit 0 when everything is on the share, 1 with one line per reason otherwise.
    SIGTERM or SIGINT ends the copy (its copier killed and reaped) and exits 128 + the signal."""
    from trainguard.actions.mirror.probe import probe_dest
    from trainguard.actions.mirror.runner import MirrorRunner
    from trainguard.store.state import SCHEMA, StateDb, choose_state_dir
    from trainguard.units import format_bytes

    loaded = load(args, quiet=True)
    if loaded is None:
        return EXIT_CONFIG
    mirrors = list(loaded.config.mirror)
    chosen = [m for m in mirrors if m.name == args.name] if args.name else [m for m in mirrors if m.enabled]
    if args.name and not chosen:
        known = ", ".join(m.name for m in mirrors) or "none configured"
        print(f"trainguard: no mirror named {args.name!r} (mirrors: {known})", file=sys.stderr)
        return EXIT_CONFIG
    if not chosen:
        print("no enabled mirrors (see [[mirror]] in config.example.toml)")
        return EXIT_OK
    db = StateDb(choose_state_dir(args.state_dir or loaded.config.general.state_dir), check=SCHEMA)
    status = EXIT_OK
    with _Interrupts() as interrupts:
        for mirror in chosen:
            if interrupts.signum:
                break
            # The daemon's statfs probe of the dest's mount first: a share that hangs ends the round in seconds.
            problem = probe_dest(mirror.dest, loaded.config.filesystems.probe_timeout)
            conn = db.connect()
            try:
                runner = interrupts.runner = MirrorRunner.open(mirror, conn)
                if interrupts.signum:
                    runner.stop()
                before = runner.record.states()[0].bytes_total
                state = runner.run(problem)
            finally:
                conn.close()
            copied = format_bytes(state.bytes_total - before)
            if state.pending_files or state.reason:
                status = EXIT_CRITICAL
                print(f"{mirror.name}: {state.pending_files} files ({format_bytes(state.pending_bytes)}) not on "
                      f"{mirror.dest}: {state.reason or 'not copied'} ({copied} copied)", file=sys.stderr)
            else:
                print(f"{mirror.name}: everything on {mirror.dest} ({copied} copied)")
    if interrupts.signum:
        print(f"trainguard: mirror stopped by {signal.Signals(interrupts.signum).name}", file=sys.stderr)
        return 128 + interrupts.signum
    return status


class _Interrupts:
    """SIGTERM and SIGINT stop the running round (its copier is killed and reaped) instead of killing this
    process at once, which would leave the copier running on its own."""

    def __init__(self) -> None:
        self.signum = 0
        self.runner = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame) -> None:
        self.signum = signum
        if self.runner is not None:
            self.runner.stop()

    def __enter__(self) -> "_Interrupts":
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
