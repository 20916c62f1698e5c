"""Mirror throughput against `rsync -a`, same run, same source, same disk.

Workload (the seed's: a trainer writing checkpoints and TensorBoard event files to local disk):
  initial : --size bytes of checkpoints (--checkpoints files) + --events event files of 4 KiB
  appends : --appends small records (200 B) appended across the event files, in --rounds rounds;
            after each round every tool brings its dest up to date
Tools, each into its own fresh dest:
  tg          : one MirrorRunner round (walk + plan + copier child: temp name, fsync, mtime, rename;
                a grown file is copied whole again, atomically)
  rsync       : rsync -a SRC/ DEST/  (no fsync: its writes may still sit in the page cache)
  rsync-fsync : rsync -a --fsync SRC/ DEST/  (durable like tg), when this rsync has --fsync
(`cp -a` stands in for rsync where rsync is missing.) Ratios are throughput tg / reference (> 1: tg faster).

    PYTHONPATH=daemon python bench/mirror_bench.py --size 5GiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon"))

from trainguard import config as configmod  # noqa: E402
from trainguard.actions.mirror.runner import MirrorRunner  # noqa: E402
from trainguard.store.state import StateDb  # noqa: E402
from trainguard.units import parse_bytes  # noqa: E402

RECORD = b"\x1a" * 200


def build(src: str, size: int, checkpoints: int, events: int) -> None:
    block = os.urandom(8 * 2**20)
    for i in range(checkpoints):
        path = os.path.join(src, f"run{i % 2}", "ckpt", f"step-{i:04d}.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        left = size // checkpoints
        with open(path, "wb") as f:
            while left > 0:
                left -= f.write(block[:min(left, len(block))])
    for i in range(events):
        path = os.path.join(src, f"run{i % 2}", "tb", f"events.out.tfevents.{i}.host")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(4096))


def append_round(src: str, events: int, appends: int, round_index: int) -> None:
    for k in range(appends):
        i = (round_index * appends + k) % events
        with open(os.path.join(src, f"run{i % 2}", "tb", f"events.out.tfevents.{i}.host"), "ab") as f:
            f.write(RECORD)


def references() -> dict[str, list[str]]:
    rsync = shutil.which("rsync")
    if rsync is None:
        return {"cp -a": ["cp", "-a", "SRC/.", "DEST/"]}
    refs = {"rsync": [rsync, "-a", "SRC/", "DEST/"]}
    probe = subprocess.run([rsync, "--fsync", "--version"], capture_output=True)
    if probe.returncode == 0:
        refs["rsync-fsync"] = [rsync, "-a", "--fsync", "SRC/", "DEST/"]
    return refs


def run_ref(argv: list[str], src: str, dest: str) -> float:
    argv = [a.replace("SRC", src).replace("DEST", dest) for a in argv]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def run_tg(runner: MirrorRunner) -> tuple[float, int]:
    before = runner.record.states()[0].bytes_total
    started = time.perf_counter()
    state = runner.run()
    took = time.perf_counter() - started
    assert state.pending_files == 0 and not state.reason, state
    return took, state.bytes_total - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="5GiB", help="checkpoint bytes in all (default 5GiB)")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--events", type=int, default=100, help="event files")
    ap.add_argument("--appends", type=int, default=10_000, help="small appends in all")
    ap.add_argument("--rounds", type=int, default=20, help="sync rounds the appends are spread over")
    ap.add_argument("--dir", default=None, help="where to build source and dests (default: $TMPDIR)")
    args = ap.parse_args()
    size = parse_bytes(args.size)
    work = tempfile.mkdtemp(prefix="tg-mirror-bench-", dir=args.dir)
    try:
        src = os.path.join(work, "src")
        build(src, size, args.checkpoints, args.events)
        refs = references()
        dests = {name: os.path.join(work, name.replace(" ", "_")) for name in ("tg", *refs)}
        for d in dests.values():
            os.makedirs(d)
        os.makedirs(os.path.join(work, "state"))
        cfg = configmod.parse({"mirror": [{"name": "bench", "source": src, "dest": dests["tg"]}]}, "bench")
        runner = MirrorRunner.open(cfg.mirror[0], StateDb(os.path.join(work, "state")).connect())
        times = {name: {"initial": 0.0, "appends": 0.0} for name in dests}
        tg_bytes = {"initial": 0, "appends": 0}
        order = list(dests)
        for phase, rounds in (("initial", 1), ("appends", args.rounds)):
            for r in range(rounds):
                if phase == "appends":
                    append_round(src, args.events, args.appends // args.rounds, r)
                os.sync()  # each tool starts with the same clean page cache state for its writes
                for name in order:
                    if name == "tg":
                        took, moved = run_tg(runner)
                        tg_bytes[phase] += moved
                    else:
                        took = run_ref(refs[name], src, dests[name])
                    times[name][phase] += took
                    os.sync()  # the next tool does not pay for this one's writeback
                order.reverse()  # neither tool always goes first
        for name in refs:
            same = subprocess.run(["diff", "-r", "-q", dests["tg"], dests[name]], capture_output=True)
            assert same.returncode == 0, same.stdout[-2000:]
        total = {n: t["initial"] + t["appends"] for n, t in times.items()}
        result = {
            "workload": {"checkpoint_bytes": size, "checkpoints": args.checkpoints, "event_files": args.events,
                         "appends": args.appends, "rounds": args.rounds},
            "seconds": {n: {**{k: round(v, 3) for k, v in t.items()}, "total": round(total[n], 3)}
                        for n, t in times.items()},
            "tg_bytes_copied": tg_bytes,
            "ratio_tg_throughput_vs": {n: round(total[n] / total["tg"], 3) for n in refs},
            "ratio_initial_vs": {n: round(times[n]["initial"] / times["tg"]["initial"], 3) for n in refs},
            "ratio_appends_vs": {n: round(times[n]["appends"] / times["tg"]["appends"], 3) for n in refs},
        }
        print(json.dumps(result, indent=2))
        runner.record.conn.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
