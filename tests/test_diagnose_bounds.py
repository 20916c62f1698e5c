"""`trainguard diagnose` answers in bounded time: at once on a host without a GPU (valid JSON, the
reason, no "retry in"), and within its stated time on a hung share, leaving no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from trainguard import cli

from tests.gpu_support import FAKE_DIR, GiB, fake_pynvml, gpu_spec
from tests.test_gpu_diagnosis import stuck_trainer  # noqa: F401 - the fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _diagnose_in_process(nvml, *argv: str) -> int:
    args = cli.build_parser().parse_args(["diagnose", *argv])
    args.nvml = nvml
    return cli.COMMANDS["diagnose"][1](args)


@pytest.mark.parametrize("error,words", [("LIBRARY_NOT_FOUND", "no NVIDIA management library"),
                                         ("DRIVER_NOT_LOADED", "kernel driver is not loaded")])
def test_no_gpu_answers_at_once_with_valid_json_and_the_reason(capsys, error, words):
    nvml = fake_pynvml.FakeNvml({"init_error": error})
    started = time.monotonic()
    code = _diagnose_in_process(nvml, "--json", "--config", os.devnull)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == cli.EXIT_CRITICAL
    doc = json.loads(out)
    assert doc["gpus"] == [] and words in doc["reason"]
    assert "retry" not in out
    assert took < 1.0, f"diagnose without a GPU took {took:.2f}s"


@pytest.mark.parametrize("script", [None, {"init_error": "DRIVER_NOT_LOADED"}], ids=["no-library", "no-driver"])
def test_no_gpu_in_a_subprocess_prints_json_and_nothing_about_retrying(tmp_path, script):
    env = dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{ROOT}/daemon")
    env.pop("TRAINGUARD_FAKE_NVML", None)  # no script: the fake behaves as a host without libnvidia-ml
    if script is not None:
        (tmp_path / "nvml.json").write_text(json.dumps(script))
        env["TRAINGUARD_FAKE_NVML"] = str(tmp_path / "nvml.json")
    out = subprocess.run([sys.executable, "-m", "trainguard", "diagnose", "--json", "--config", os.devnull],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == cli.EXIT_CRITICAL
    doc = json.loads(out.stdout)
    assert doc == {"gpus": [], "reason": doc["reason"]} and doc["reason"]
    assert "retry" not in out.stdout + out.stderr


def _session_members(sid: int) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6: session id
            found.append(name)
    return found


def test_diagnose_on_a_hung_share_returns_in_time_and_leaves_nothing(stuck_trainer, tmp_path):
    child, _tid, events, fs = stuck_trainer
    fs.block("all")  # statfs, getattr, open: the whole share hangs now
    script = {"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                  "processes": [{"pid": child.pid, "used": 76 * GiB}]}])]}
    (tmp_path / "nvml.json").write_text(json.dumps(script))
    env = dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{ROOT}/daemon",
               TRAINGUARD_FAKE_NVML=str(tmp_path / "nvml.json"))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainguard", "diagnose", "--json", "--wait", "1",
                             "--config", os.devnull], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 0, err
    (d,) = json.loads(out)["gpus"]
    assert str(events) in d["verdict"] and str(fs.mountpoint) in d["verdict"]
    assert _session_members(proc.pid) == []  # no probe child, no py-spy left behind
    # Stated: --wait, plus the 5 s diagnosis deadline, plus interpreter start (generous on a loaded machine).
    assert took < 1 + 5 + 10, f"diagnose on a hung share took {took:.1f}s"
    print(f"\ndiagnose on a hung share: {took:.2f}s wall (--wait 1)")
