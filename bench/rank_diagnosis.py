#!/usr/bin/env python3
"""How long the diagnosis of a hung run takes (two py-spy dumps of each rank some seconds apart, and
/proc), against its parts measured in the same run: the pause between the dumps plus one py-spy dump
per inspected rank, twice.

    PYTHONPATH=daemon python3 bench/rank_diagnosis.py [--ranks 4 16 32] [--runs 3]

The ranks are real Python processes waiting in a function `all_reduce` of a module under
torch/distributed/ (as tests/test_rank_diagnosis.py starts them). Above 16 ranks, 16 are inspected.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "daemon")]

from trainguard.diagnosis.ranks import MAX_RANKS, Gatherer  # noqa: E402

from tests.test_rank_diagnosis import _go, _start_ranks, _stop  # noqa: E402


def _one_dump(exe: str, pid: int) -> float:
    start = time.monotonic()
    subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True, check=True)
    return time.monotonic() - start


def measure(count: int, runs: int, exe: str) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        ranks = _start_ranks(Path(tmp), count, -1, "/dev/null")
        try:
            _go(ranks, list(range(count)))
            pairs = [(r, c.pid) for r, c in enumerate(ranks)]
            gatherer = Gatherer(py_spy_path=exe)
            took, verdict = [], ""
            for _ in range(runs):
                start = time.monotonic()
                verdict = gatherer.gather(pairs, (), time.time(), time.monotonic() + 60)["verdict"]
                took.append(time.monotonic() - start)
            dump = statistics.median(_one_dump(exe, c.pid) for c in ranks[:MAX_RANKS])
        finally:
            _stop(ranks)
    reference = gatherer.interval + 2 * min(count, MAX_RANKS) * dump
    return statistics.median(took), reference, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("py-spy")
    if exe is None:
        sys.exit("py-spy is not installed (pip install '.[test]')")
    print(f"{'ranks':>5} {'diagnosis s':>12} {'reference s':>12} {'ratio':>6}  verdict")
    for count in args.ranks:
        took, reference, verdict = measure(count, args.runs, exe)
        print(f"{count:>5} {took:>12.2f} {reference:>12.2f} {took / reference:>6.2f}  {verdict}")


if __name__ == "__main__":
    main()
