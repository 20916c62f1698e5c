"""How fast the progress watchdog calls a hang, and how often it calls one that is not.

    PYTHONPATH=daemon python bench/hang_latency.py [--hours 100] [--hangs 30] [--seed 1]

Generated runs, cycle by cycle at the daemon's default 10 s interval, through the watchdog's own pure
functions (store.progress.advance, detectors.progress.detect_hangs) with the default [progress] config.
Each profile is a cadence of steps with evaluation passes (silent, GPUs computing at training power) and
checkpoint saves (the GPUs idle, and the save seen only as it starts writing: the worst case, a save
whose later writes the daemon cannot see),
each duration jittered by +-20 %, after 10 minutes of start-up before step 1:

- false alarms: `--hours` of each profile without a hang: every train.hang is a false alarm (must be 0);
- latency: `--hangs` runs per profile hang at a random time after 3 hours (GPUs spinning at 100 % and
  low power); the time from the hang to the alert, against PyTorch's default NCCL collective
  timeout (600 s, the first the job itself can notice) and nvidia-resiliency-ext's default heartbeat
  timeouts (45 min between heartbeats, 60 min before the first), as ratios.

Also the sampling cost: RunSampler over 4 real child processes with 64 files each open for writing,
against the stall diagnosis's per-process reading (sources.procs.inspect_process) of the same
processes, both measured here.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from trainguard import config as configmod
from trainguard.detectors.progress import detect_hangs
from trainguard.records import GpuProcess, GpuSample, RankSample, RunSample
from trainguard.sources.procs import inspect_process
from trainguard.sources.runs import RunSampler
from trainguard.store.progress import advance

INTERVAL = 10.0
NCCL_TIMEOUT = 600.0  # torch.distributed's default collective timeout with NCCL
NVRX_HEARTBEAT = 45 * 60.0  # nvidia-resiliency-ext's default timeouts: between heartbeats
NVRX_INITIAL = 60 * 60.0  # ... and before the first one
STARTUP = 600.0
TRAINING = (0.95, 300.0)  # (utilisation, W)
IDLE = (0.0, 60.0)
SPIN = (1.0, 70.0)


@dataclass(frozen=True)
class Profile:
    name: str
    step_s: float
    eval_every: int  # steps
    eval_steps: float  # an evaluation lasts this many steps' time
    save_every_s: float
    save_s: float


PROFILES = (
    Profile("fast steps, eval 10x a step, 5-min saves", 0.5, 2000, 10, 1800, 300),
    Profile("10 s steps, 10-min evals, 5-min saves", 10.0, 300, 60, 3600, 300),
    Profile("40 s steps (LLM), 30-min evals, 5-min saves", 40.0, 100, 45, 3 * 3600, 300),
)


def phases(p: Profile, rng: random.Random, until: float):
    """(start, end, kind) of the silent phases, kind "eval" or "save"; steps fill the rest."""
    t, step_t, next_save, out = STARTUP, STARTUP, STARTUP + p.save_every_s, []
    while t < until:
        run_for = p.eval_every * p.step_s * rng.uniform(0.8, 1.2)
        if step_t + run_for > next_save:
            out.append((next_save, next_save + p.save_s * rng.uniform(0.8, 1.0), "save"))
            step_t = out[-1][1]
            next_save = step_t + p.save_every_s
            t = step_t
            continue
        start = step_t + run_for
        out.append((start, start + p.eval_steps * p.step_s * rng.uniform(0.8, 1.2), "eval"))
        step_t = t = out[-1][1]
        next_save = max(next_save, step_t)  # a save due during the evaluation comes right after it
    return out


def simulate(p: Profile, rng: random.Random, hours: float, hang_at: float | None) -> tuple[list[float], float]:
    """(times of train.hang findings, the last progress before the hang)."""
    cfg = configmod.Config().progress
    silent = phases(p, rng, hours * 3600)
    c, mark, last_step, fired, last_progress, i, alerted = None, 0, STARTUP, [], 0.0, 0, False
    seen: set[int] = set()  # the saves whose start was seen
    t = 0.0
    while t < hours * 3600:
        t += INTERVAL
        while i < len(silent) and silent[i][1] <= t - INTERVAL:
            i += 1
        phase = silent[i][2] if i < len(silent) and silent[i][0] < t else None
        hung = hang_at is not None and t >= hang_at
        if t < STARTUP or hung:
            gpu = IDLE if t < STARTUP else SPIN
        elif phase == "eval":
            gpu = TRAINING
        elif phase == "save":
            gpu = IDLE
            if i not in seen:  # the save opens its file and starts writing: seen once
                seen.add(i)
                mark += 1
        else:
            gpu = TRAINING
            if t - last_step >= p.step_s:
                mark += 1
                last_step, last_progress = t, t
        run = RunSample("1@1", "torchrun-1", (RankSample(2, 0, mark, t, gpus=(0,)),))
        gpus = [GpuSample(0, "GPU-0", "H100", t, util_ratio=gpu[0], power_w=gpu[1], power_limit_w=700.0)]
        c = advance(c, run, {0: gpus[0]}, t, max_step=3 * INTERVAL, learn=not alerted)
        alerted = bool(detect_hangs(cfg, [run], {run.run_id: c}, gpus, t))
        if alerted:
            fired.append(t)
            if hang_at is not None:
                break
    return fired, last_progress


def sampling_cost(rounds: int = 50) -> tuple[float, float]:
    """Seconds per cycle: RunSampler over 4 ranks, and inspect_process of the same 4 (the reference)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = ("import os,sys,time\nfs=[open(os.path.join(sys.argv[1], f'f{os.getpid()}-{i}'), 'w') "
                "for i in range(64)]\nprint('up', flush=True)\ntime.sleep(600)")
        kids = [subprocess.Popen([sys.executable, "-c", code, tmp], stdout=subprocess.PIPE, text=True)
                for _ in range(4)]
        try:
            for k in kids:
                k.stdout.readline()
            gpus = [GpuSample(i, f"GPU-{i}", "H100", 0.0, processes=(GpuProcess(k.pid, k.pid, 1),))
                    for i, k in enumerate(kids)]
            sampler = RunSampler()
            started = time.perf_counter()
            for n in range(rounds):
                sampler.sample(float(n), gpus)
            ours = (time.perf_counter() - started) / rounds
            started = time.perf_counter()
            for _ in range(rounds):
                for k in kids:
                    inspect_process("/proc", k.pid)
            reference = (time.perf_counter() - started) / rounds
        finally:
            for k in kids:
                k.kill()
                k.wait()
    return ours, reference


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=100.0)
    ap.add_argument("--hangs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"{'profile':48} {'false alarms':>12} {'latency p50':>11} {'p95':>6} "
          f"{'/NCCL 600s':>10} {'/NVRx 45m':>9} {'/NVRx 60m':>9}")
    total_false = 0
    for p in PROFILES:
        false, _ = simulate(p, rng, args.hours, None)
        total_false += len(false)
        latencies = []
        for _ in range(args.hangs):
            hang_at = rng.uniform(3 * 3600, 3 * 3600 + 4 * 3600)
            fired, _last = simulate(p, rng, hang_at / 3600 + 3, hang_at)
            latencies.append(fired[-1] - hang_at if fired else float("inf"))
        p50 = statistics.median(latencies)
        p95 = sorted(latencies)[int(0.95 * (len(latencies) - 1))]
        print(f"{p.name:48} {len(false):12d} {p50:10.0f}s {p95:5.0f}s {p50 / NCCL_TIMEOUT:10.2f} "
              f"{p50 / NVRX_HEARTBEAT:9.2f} {p50 / NVRX_INITIAL:9.2f}")
    print(f"false alarms over {args.hours:g} h of each of {len(PROFILES)} profiles: {total_false}")
    ours, reference = sampling_cost()
    print(f"sampling 4 ranks x 64 open files: {ours * 1e3:.2f} ms a cycle; inspect_process of the same 4: "
          f"{reference * 1e3:.2f} ms; ratio {ours / reference:.2f}")
    if total_false:
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
