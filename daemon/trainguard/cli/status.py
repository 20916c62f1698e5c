"""`trainguard status` (sample now and report) and `trainguard diagnose` (what a GPU's processes do)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from trainguard.cli.common import EXIT_CONFIG, EXIT_CRITICAL, EXIT_OK, load, one_shot_reason


def cmd_status(args: argparse.Namespace) -> int:
    from trainguard.clock import SystemClock
    from trainguard.sources.diskstats import DiskstatsSampler

    loaded = load(args, quiet=True)
    if loaded is None:
        return EXIT_CONFIG
    # I/O rates need two diskstats readings: the first now, the second after the imports, the state and
    # the mount probes below, which take their time anyway; status never sleeps for a rate.
    clock = SystemClock()
    disks = DiskstatsSampler(clock=clock, proc_root=loaded.config.general.proc_root)
    disks.sample()
    from trainguard.redact import scrub
    from trainguard.surfaces import status

    doc = status.build(loaded.config, state_dir=args.state_dir, clock=clock, disks=disks)
    if doc.get("gpu_status"):  # a one-shot command does not retry: no "(retry in 10s)", no next_retry
        doc["gpu_status"] = {**doc["gpu_status"], "message": one_shot_reason(doc["gpu_status"]), "next_retry": None}
    lang = loaded.config.notify.language
    if args.html:
        from trainguard.surfaces.status_page import render_page

        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(render_page(doc, lang))
    # Findings quote watched log lines, which may carry a token: status never shows one.
    print(scrub(json.dumps(doc, indent=2) if args.json else status.render(doc, lang)))
    return EXIT_OK


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

    loaded = load(args, quiet=True)
    if loaded is None:
        return EXIT_CONFIG
    cfg = loaded.config
    sampler = gpu_sampler(cfg, SystemClock(), getattr(args, "nvml", None))
    if sampler is None:
        return _no_gpu(args, "GPU monitoring is disabled ([gpu] enabled = false)", EXIT_CONFIG)
    sampler.xid_events = False  # one shot: no XID listener thread to start and join (0.5 s)
    logging.getLogger("trainguard.gpu").setLevel(logging.ERROR)  # printed once below, without "retry in"
    reading = sampler.sample()
    if not reading.gpus:
        sampler.close()
        return _no_gpu(args, one_shot_reason(reading.status), EXIT_CRITICAL)
    from trainguard.diagnosis import stall as diagnosis  # only now: a host without a GPU need not load it

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

