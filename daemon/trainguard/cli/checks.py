"""`trainguard check-config` and `trainguard test-alert`: is the configuration right, does delivery work?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from trainguard import config as configmod
from trainguard.cli.common import EXIT_CONFIG, EXIT_CRITICAL, EXIT_OK, load


def cmd_check_config(args: argparse.Namespace) -> int:
    path = args.path or args.config
    try:
        loaded = configmod.load(path)
    except configmod.ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    problems = check_targets(loaded.config.notify.targets)
    if problems:
        print("invalid configuration:\n" + "\n".join(f"{loaded.source}: notify.targets: {p}" for p in problems),
              file=sys.stderr)
        return EXIT_CONFIG
    effective = configmod.dump(loaded.config)
    from trainguard.actions.cleanup.engine.compiled import loop_doc

    loop = loop_doc()
    if args.json:
        print(json.dumps({"valid": True, "sources": [loaded.source, *loaded.env_vars], "config": effective,
                          "cleanup_loop": loop}, indent=2))
        return EXIT_OK
    from trainguard.config.render import to_toml

    print(f"# valid: {loaded.source}")
    print(f"# merged: {loaded.sources}")
    print(f"# {loop['message']}")
    print(to_toml(effective), end="")
    return EXIT_OK


def check_targets(targets: Sequence[configmod.NotifyTarget]) -> list[str]:
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

    loaded = load(args, quiet=True)
    if loaded is None:
        return EXIT_CONFIG
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

