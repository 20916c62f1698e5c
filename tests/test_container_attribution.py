"""Inside a container without the host PID namespace (AutoDL-style): NVML's PIDs do not resolve,
so the GPU process is inferred from what it holds, and the diagnosis still names the trainer,
the tfevents file it is stuck writing and the FUSE share under it.

A real tb_trainer runs in a real new PID namespace (tests/support/container.py) holding the
NVIDIA device stand-ins; trainguard runs inside that namespace too, like `docker exec`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec
from tests.support.container import GPU_MINOR, GpuContainer, container_reason

ROOT = Path(__file__).resolve().parent.parent
TB_TRAINER = ROOT / "tests" / "scenarios" / "tb_trainer.py"
STANDIN = ROOT / "tests" / "support" / "cuda_standin.py"
ABSENT_HOST_PID = 4_000_001  # above pid_max's default: no process has it in the container

ALERT = """
import json, time
import pynvml
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.notify.messages import compose
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity, Snapshot
from trainguard.sources.gpu import GpuSampler
gpu = GpuSampler(pynvml, xid_events=False).sample().gpus[0]
now = time.time()
stall = Finding("gpu.stall:0", Severity.CRITICAL, "GPU 0 stalled", details={"gpu": 0, "util_recent": [0.0]})
(finding,) = StallDiagnoser(py_spy=False).enrich([stall], Snapshot(ts=now, gpus=(gpu,)), now)
message = compose("box", [AlertEvent(AlertStatus.FIRING, finding, started_at=now, ts=now)])
print(json.dumps({"text": message.text, "details": finding.details}))
"""


@pytest.fixture
def boxed_trainer(slowfs, tmp_path):
    """tb_trainer in a new PID namespace, its writer thread stuck writing tfevents on the hung share."""
    if reason := container_reason():
        pytest.skip(reason)
    lib = tmp_path / "lib" / "libcuda.so.1"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 4096)
    status = tmp_path / "status.json"
    command = [sys.executable, str(STANDIN), "--minor", str(GPU_MINOR), "--lib", str(lib), str(TB_TRAINER),
               "--logdir", str(slowfs.mountpoint / "runs" / "exp1"), "--heartbeat", str(tmp_path / "hb"),
               "--status", str(status), "--step-seconds", "0.02", "--max-queue", "2"]
    with GpuContainer(command, env=dict(os.environ, CUDA_VISIBLE_DEVICES="0")) as box:
        deadline = time.monotonic() + 30
        while not (status.exists() and json.loads(status.read_text())["written"] > 0):
            assert time.monotonic() < deadline, "the trainer did not start writing"
            time.sleep(0.05)
        slowfs.block("write")
        slowfs.wait_blocked("write", timeout=10)
        try:
            yield box, json.loads(status.read_text()), slowfs
        finally:
            slowfs.unblock("all")


def _env(tmp_path: Path, processes: list[dict]) -> dict[str, str]:
    script = {"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB, "processes": processes}],
                                minor_number=GPU_MINOR)]}
    (tmp_path / "nvml.json").write_text(json.dumps(script))
    return dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{ROOT / 'daemon'}",
                TRAINGUARD_FAKE_NVML=str(tmp_path / "nvml.json"))


@pytest.mark.parametrize("processes", [[{"pid": ABSENT_HOST_PID, "used": 76 * GiB}], []],
                         ids=["host-pid-unresolvable", "nvml-reports-none"])
def test_diagnose_in_the_container_names_trainer_file_and_share(boxed_trainer, tmp_path, processes):
    box, status, fs = boxed_trainer
    started = time.monotonic()
    out = box.exec([sys.executable, "-m", "trainguard", "diagnose", "--json", "--wait", "0.5",
                    "--state-dir", str(tmp_path / "state")], env=_env(tmp_path, processes), timeout=60)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    (d,) = json.loads(out.stdout)["gpus"]
    assert d["attribution"] == "inferred"
    (view,) = [v for v in d["processes"] if v["inferred_from"]]
    assert view["pid"] == status["pid"]  # the PID in the container's namespace
    assert str(TB_TRAINER) in view["cmdline"]
    assert f"/dev/nvidia{GPU_MINOR}" in view["inferred_from"] and "/dev/nvidia-uvm" in view["inferred_from"]
    assert "libcuda.so.1" in view["inferred_from"] and "CUDA_VISIBLE_DEVICES=0" in view["inferred_from"]
    if processes:
        assert view["host_pid"] == ABSENT_HOST_PID and view["used_memory_bytes"] == 76 * GiB
    (thread,) = [t for t in view["blocked_threads"] if t["file"]]
    assert thread["file"] == status["event_file"] and thread["syscall"] == "write"
    assert thread["mount_point"] == str(fs.mountpoint)
    assert f"PID {status['pid']} [{os.path.basename(sys.executable)} cuda_standin.py] (inferred:" in d["verdict"]
    assert f"blocked writing {status['event_file']} on {fs.fstype} at {fs.mountpoint}" in d["verdict"]
    assert took < 15, f"diagnose took {took:.1f}s"


def test_stall_alert_in_the_container_names_process_file_and_mount(boxed_trainer, tmp_path):
    box, status, fs = boxed_trainer
    out = box.exec([sys.executable, "-c", ALERT],
                   env=_env(tmp_path, [{"pid": ABSENT_HOST_PID, "used": 76 * GiB}]), timeout=60)
    assert out.returncode == 0, out.stderr
    alert = json.loads(out.stdout)
    assert alert["details"]["attribution"] == "inferred" and not alert["details"]["diagnosis_timed_out"]
    headline = alert["text"].splitlines()[0] + alert["text"]
    for part in (f"PID {status['pid']}", "inferred", status["event_file"], str(fs.mountpoint)):
        assert part in headline, (part, alert["text"])
