"""GPU part figures: sampling cost, stall-to-alert latency, diagnosis time.

  PYTHONPATH=daemon:. python bench/gpu_bench.py

1. One GPU sampling cycle with 8 fake GPUs and 50 compute processes, as a ratio to
   the same NVML calls made bare (the fake's own cost), so the figure is trainguard's overhead.
2. Stall start -> alert at default settings (for=5m, 10 s interval), on a fake clock, for
   several phase offsets; target: for + one interval.
3. Diagnosis of a stalled GPU with 8 processes while 500 processes run on the host, as a
   ratio to one `ps`-like scan (read every /proc/PID/stat).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemon"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainguard.diagnosis.stall import StallDiagnoser  # noqa: E402
from trainguard.records import Snapshot  # noqa: E402
from trainguard.sources.gpu import GpuSampler  # noqa: E402

from tests.gpu_support import FakeClock, GiB, Scenario, fake_pynvml, gpu_spec  # noqa: E402


def best(fn, repeat=5, number=20):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def sampling_cost() -> None:
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:50]
    procs = [{"pid": pid, "used": GiB} for pid in pids]
    gpus = [gpu_spec([{"at": 0, "util": 90, "mem_used": 60 * GiB, "processes": procs[i::8]}]) for i in range(8)]
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": gpus}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock, xid_events=False)

    def cycle():
        clock.advance(10)
        sampler.sample()

    cycle()  # initialises NVML
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]

    def bare():
        clock.advance(10)
        for h in handles:
            nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
            try:
                nvml.nvmlDeviceGetSamples(h, 1, int((clock.now - 10) * 1e6))
            except nvml.NVMLError:
                pass
            nvml.nvmlDeviceGetUtilizationRates(h)
            nvml.nvmlDeviceGetTemperature(h, 0)
            nvml.nvmlDeviceGetPowerUsage(h)
            nvml.nvmlDeviceGetEnforcedPowerLimit(h)
            nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            nvml.nvmlDeviceGetComputeRunningProcesses(h)
            nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0)
            nvml.nvmlDeviceGetRetiredPages(h, 0)
            nvml.nvmlDeviceGetRetiredPages(h, 1)
            nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)

    cycle()
    ours, ref = best(cycle), best(bare)
    print(f"sampling cycle, 8 GPUs / {len(procs)} processes: {ours * 1e3:.2f} ms "
          f"= {ours / ref:.2f}x the bare NVML calls ({ref * 1e3:.2f} ms); "
          f"at a 10 s interval {ours / 10 * 100:.3f} % of one core")
    sampler.close()


def stall_latency() -> None:
    delays = []
    for offset in (0.0, 2.5, 5.0, 7.5):
        start = 1200 + offset
        s = Scenario({"gpus": [gpu_spec([
            {"at": 0, "util": 95, "mem_used": 76 * GiB, "processes": [{"pid": os.getpid(), "used": 76 * GiB}]},
            {"at": start, "util": 0}])]})
        s.run_until(start + 600)
        fired = s.firing("gpu.stall")
        delays.append(fired[0][0] - start if fired else float("inf"))
    print(f"stall start -> alert (for=5m, interval 10s): {', '.join(f'{d:.1f}s' for d in delays)}; "
          f"target <= 310s; worst = {max(delays) / 310:.2f}x target")


def diagnosis_time() -> None:
    sleepers = [subprocess.Popen(["sleep", "120"]) for _ in range(500)]
    try:
        holders = sleepers[:8]
        clock = FakeClock()
        nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB, "processes": [
            {"pid": p.pid, "used": 9 * GiB} for p in holders]}])]}, clock=clock)
        sampler = GpuSampler(nvml, clock=clock, xid_events=False)
        gpu = sampler.sample().gpus[0]
        snapshot = Snapshot(ts=clock.now, gpus=(gpu,))
        diagnoser = StallDiagnoser(py_spy=False)
        diagnoser.observe(snapshot)
        ours = best(lambda: diagnoser.diagnose(gpu, snapshot, clock.now), repeat=3, number=5)

        def ps_scan():
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{name}/stat", "rb") as fh:
                            fh.read()
                    except OSError:
                        pass

        ref = best(ps_scan, repeat=3, number=5)
        count = sum(1 for n in os.listdir("/proc") if n.isdigit())
        print(f"diagnosis, 8 GPU processes, {count} processes on the host: {ours * 1e3:.1f} ms "
              f"= {ours / ref:.2f}x one ps-like scan of /proc ({ref * 1e3:.1f} ms)")
        sampler.close()
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()


if __name__ == "__main__":
    sampling_cost()
    stall_latency()
    diagnosis_time()
