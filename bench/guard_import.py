"""What `import trainguard.guard` costs a training process, on top of a bare interpreter.

    PYTHONPATH=daemon python bench/guard_import.py [--runs 30]

Starts fresh interpreters in turn (so machine noise hits all alike): a bare one, one that
imports trainguard.guard, and, as the reference, one that imports trainguard.config (the
pydantic-based configuration the guard avoids); then the same bare/guard pair under `python -S`
(no site: modules a site-packages .pth file happens to preload, like re or typing, count too). Each reports its own wall time for the
import and VmRSS before and after it. Prints medians, the deltas over the bare interpreter and
the ratios. Goal (issue 20): < 30 ms and < 5 MiB on top of the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MiB = 2**20
PROBE = """
import json, sys, time
def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmRSS:"))
before, t0 = rss(), time.perf_counter()
{stmt}
t1 = time.perf_counter()
print(json.dumps({{"s": t1 - t0, "rss": rss() - before,
                   "heavy": [m for m in ("pydantic", "apprise", "prometheus_client", "sqlite3") if m in sys.modules]}}))
"""
CASES = {"bare": ((), "pass"), "guard": ((), "import trainguard.guard"),
         "config (reference)": ((), "import trainguard.config"),
         "bare -S": (("-S",), "pass"), "guard -S": (("-S",), "import trainguard.guard")}


def run(flags: tuple[str, ...], stmt: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, *flags, "-c", PROBE.format(stmt=stmt)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["PYTHONPATH"] = os.path.join(REPO, "daemon")
    results: dict[str, list[dict]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, (flags, stmt) in CASES.items():
            results[name].append(run(flags, stmt, env))
    med = {name: (statistics.median(r["s"] for r in rows), statistics.median(r["rss"] for r in rows))
           for name, rows in results.items()}
    bare_s, bare_rss = med["bare"]
    print(f"{'case':<20} {'import ms':>10} {'RSS MiB':>9}   (median of {args.runs}, minus the bare interpreter)")
    for name, (s, rss) in med.items():
        base_s, base_rss = med["bare -S"] if name.endswith("-S") else med["bare"]
        print(f"{name:<20} {(s - base_s) * 1e3:>10.2f} {(rss - base_rss) / MiB:>9.2f}")
    g_s, g_rss = med["guard"][0] - bare_s, (med["guard"][1] - bare_rss) / MiB
    gs_s, gs_rss = med["guard -S"][0] - med["bare -S"][0], (med["guard -S"][1] - med["bare -S"][1]) / MiB
    c_s, c_rss = med["config (reference)"][0] - bare_s, (med["config (reference)"][1] - bare_rss) / MiB
    print(f"guard / config: time {g_s / c_s:.2f}x, RSS {g_rss / c_rss:.2f}x")
    heavy = sorted({m for r in results["guard"] for m in r["heavy"]})
    print(f"heavy modules loaded by the guard: {heavy or 'none'}")
    ok = max(g_s, gs_s) < 0.030 and max(g_rss, gs_rss) < 5 and not heavy
    print("goal (< 30 ms, < 5 MiB, none heavy):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
