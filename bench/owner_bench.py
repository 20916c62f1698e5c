"""What naming a process's owner adds to inspecting it (the stall diagnosis and the placement scan).

  PYTHONPATH=daemon python bench/owner_bench.py

50 real processes, each with a Slurm-like environment of ~4 KiB (so /proc/PID/environ is read and
parsed); per process, what the owner adds (sources.owner.read_owner given the cgroup and status texts
inspect_process has read anyway: environ, parsing, the user's name) as a ratio to the whole inspection the
diagnosis makes of it (procs.inspect_process, which includes it), in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemon"))

from trainguard.sources import procs  # noqa: E402
from trainguard.sources.owner import read_owner  # noqa: E402

PROCESSES = 50


def best(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "nlp",
           "SLURM_JOB_USER": "alice", **{f"VAR_{i}": "x" * 60 for i in range(60)}}
    children = [subprocess.Popen(["sleep", "600"], env=env) for _ in range(PROCESSES)]
    try:
        time.sleep(0.2)
        pids = [c.pid for c in children]
        inspect = best(lambda: [procs.inspect_process("/proc", pid) for pid in pids])
        texts = {pid: (open(f"/proc/{pid}/cgroup").read(), open(f"/proc/{pid}/status").read()) for pid in pids}
        # What inspect_process adds: it has read cgroup and status already; environ, parsing, the user's name.
        owner = best(lambda: [read_owner("/proc", pid, *texts[pid]) for pid in pids])
        print(f"{PROCESSES} processes: inspect_process {inspect / PROCESSES * 1e6:.0f} µs each "
              f"(owner included), read_owner {owner / PROCESSES * 1e6:.0f} µs each: "
              f"{owner / inspect:.2f}x of the inspection")
    finally:
        for c in children:
            c.kill()
            c.wait()


if __name__ == "__main__":
    main()
