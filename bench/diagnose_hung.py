#!/usr/bin/env python3
"""How long `trainguard diagnose --json` takes on a hung share, against the same command on the same
share while it answers; and in a container (new PID namespace, attribution inferred).

    sudo PYTHONPATH=daemon python3 bench/diagnose_hung.py [--runs 5] [--wait 2]

A trainer-like process holds the (fake, scripted) GPU and keeps a tfevents file open on a real
FUSE mount. Reference: the share answers and nothing is blocked. Hung: every operation of the
share blocks and the trainer's writer thread is stuck in write(). Each run is a fresh
`python -m trainguard diagnose` process in its own session; any process of that session still
alive after it exits (a probe child, a py-spy) is counted as left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "daemon")]

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec  # noqa: E402
from tests.support.container import GPU_MINOR, GpuContainer, container_reason  # noqa: E402
from tests.support.slowfs import SlowFs, fuse_available  # noqa: E402

TRAINER = """
import sys, threading, time
fh = open(sys.argv[1], "ab", buffering=0)
def writer():
    while True:
        fh.write(b"event")  # blocks in write() once the share hangs
        time.sleep(0.05)
threading.Thread(target=writer, name="EventFileWriter", daemon=True).start()
threading.Event().wait()
"""


def session_left(sid: int) -> int:
    left = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as fh:
                left += int(fh.read().rsplit(")", 1)[1].split()[3]) == sid
        except (OSError, ValueError, IndexError):
            continue
    return left


def diagnose(prefix: list[str], env: dict[str, str], wait: float) -> tuple[float, int, dict]:
    started = time.monotonic()
    argv = [sys.executable, "-m", "trainguard", "diagnose", "--json", "--wait", str(wait), "--config", os.devnull]
    proc = subprocess.Popen([*prefix, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"diagnose failed: {err}")
    return took, session_left(proc.pid), json.loads(out)["gpus"][0]


def series(label: str, runs: int, prefix: list[str], env: dict[str, str], wait: float) -> float:
    times, left, verdict = [], 0, ""
    for _ in range(runs):
        took, stray, d = diagnose(prefix, env, wait)
        times.append(took)
        left += stray
        verdict = d["verdict"]
    median = statistics.median(times)
    print(f"{label:<34} median {median:5.2f}s  max {max(times):5.2f}s  left behind {left}  verdict: {verdict[:80]}")
    return median


def nvml_env(tmp: Path, pid: int | None) -> dict[str, str]:
    tmp.mkdir(exist_ok=True)
    processes = [{"pid": pid if pid is not None else 4_000_001, "used": 76 * GiB}]
    timeline = [{"at": 0, "util": 0, "mem_used": 76 * GiB, "processes": processes}]
    (tmp / "nvml.json").write_text(json.dumps({"gpus": [gpu_spec(timeline, minor_number=GPU_MINOR)]}))
    return dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{REPO / 'daemon'}",
                TRAINGUARD_FAKE_NVML=str(tmp / "nvml.json"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--wait", type=float, default=2.0, help="diagnose --wait (its default is 2)")
    args = ap.parse_args()
    if reason := fuse_available() or container_reason():
        print(f"skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory(prefix="tg-diag-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "mnt").mkdir()
        (tmp / "trainer.py").write_text(TRAINER)
        (tmp / "libcuda.so.1").write_bytes(b"\0" * 4096)
        with SlowFs(tmp / "mnt") as fs:
            (fs.mountpoint / "runs").mkdir()
            trainer = subprocess.Popen([sys.executable, str(tmp / "trainer.py"),
                                        str(fs.mountpoint / "runs" / "events.out.tfevents.1.host")])
            boxed = [sys.executable, str(REPO / "tests" / "support" / "cuda_standin.py"), "--minor", str(GPU_MINOR),
                     "--lib", str(tmp / "libcuda.so.1"), str(tmp / "trainer.py"),
                     str(fs.mountpoint / "runs" / "events.out.tfevents.2.box")]
            try:
                with GpuContainer(boxed) as box:
                    time.sleep(1.0)  # both writers are writing
                    inside = ["nsenter", "--target", str(box.init_pid), "--pid", "--mount", "--"]
                    host_env, box_env = nvml_env(tmp, trainer.pid), nvml_env(tmp / "box", None)
                    ref = series("host, share answering (reference)", args.runs, [], host_env, args.wait)
                    box_ref = series("container, share answering", args.runs, inside, box_env, args.wait)
                    fs.block("all")
                    fs.wait_blocked("write", count=2, timeout=10)
                    hung = series("host, share hung", args.runs, [], host_env, args.wait)
                    box_hung = series("container, share hung", args.runs, inside, box_env, args.wait)
                    fs.unblock("all")
            finally:
                fs.unblock("all")
                trainer.kill()
                trainer.wait()
    print(f"hung / answering: host {hung / ref:.2f}x, container {box_hung / box_ref:.2f}x; "
          f"container / host (hung): {box_hung / hung:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
