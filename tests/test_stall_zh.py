"""A Chinese reader gets the stall diagnosis in Chinese: the verdict is said from the diagnosis facts
(process, thread, file, mount), in the alert delivered over HTTP and on the `trainguard diagnose` screen,
while the JSON keeps the English line and the language-neutral facts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from trainguard import config
from trainguard.diagnosis.stall import StallDiagnoser, render
from trainguard.notify.apprise_sender import AppriseSender
from trainguard.notify.messages import compose
from trainguard.records import (
    AlertEvent,
    AlertStatus,
    Finding,
    FsSample,
    Mount,
    MountKind,
    Severity,
    Snapshot,
)

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec
from tests.support.http_receiver import HttpReceiver
from tests.test_gpu_diagnosis import _gpu_holding, stuck_trainer  # noqa: F401 - the fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAN = re.compile(r"[\u4e00-\u9fff]")


def _stalled(gpu, clock, fs):
    """The detector's gpu.stall finding for the GPU, enriched by the diagnoser with a mount hung for 7m."""
    mount = Mount(str(fs.mountpoint), fs.fstype, fs.source, 0, 0, MountKind.FUSE)
    probe = FsSample(mount, clock.now, None, responsive=False, unresponsive_since=clock.now - 420)
    snapshot = Snapshot(ts=clock.now, filesystems=(probe,), gpus=(gpu,))
    stall = Finding("gpu.stall:0", Severity.CRITICAL, "GPU 0 stalled", labels={"gpu": "0"}, details={
        "gpu": 0, "name": gpu.name, "memory_used_bytes": gpu.memory_used_bytes,
        "memory_total_bytes": gpu.memory_total_bytes, "util_mean_ratio": 0.0, "util_recent": [0.0] * 5,
        "stalled_since": clock.now - 1900, "stalled_for_s": 1900.0})
    diagnoser = StallDiagnoser(py_spy=False, clock=clock)
    diagnoser.observe(snapshot)
    try:
        (enriched,) = diagnoser.enrich([stall], snapshot, clock.now)
        return enriched, diagnoser.diagnose(gpu, snapshot, clock.now)
    finally:
        diagnoser.close()


def test_zh_stall_alert_over_http_names_process_file_and_mount_in_chinese(stuck_trainer):
    child, _tid, events, fs = stuck_trainer
    clock, gpu = _gpu_holding(child.pid)
    enriched, _d = _stalled(gpu, clock, fs)
    with HttpReceiver() as receiver:
        target = config.parse({"notify": {"targets": [
            {"name": "robot", "url": f"json://127.0.0.1:{receiver.port}/hook", "language": "zh"}]}},
            "t").notify.targets[0]
        message = compose("gpu3", [AlertEvent(AlertStatus.FIRING, enriched, started_at=clock.now, ts=clock.now)],
                          "zh")
        assert AppriseSender().send(target, message).ok
        doc = receiver.wait_for(1, timeout=10)[0].json()
    assert doc["title"] == "gpu3 GPU 0 已空转 31m"
    body = doc["message"]
    assert f"诊断：PID {child.pid} [{os.path.basename(sys.executable)} -c] 的线程 " in body, body
    assert f"在写入 {events} 时阻塞（{fs.fstype}，挂载点 {fs.mountpoint}），该挂载已 7m 无响应。" in body, body
    assert "下一步：TensorBoard 的 event writer 卡在共享文件系统上" in body
    assert f"。{fs.mountpoint} 没有响应：检查它的 FUSE 守护进程" in body
    assert "blocked" not in body and "Diagnosis" not in body  # nothing English left in the verdict
    # What machines read stays English, and the facts stay facts.
    assert enriched.details["verdict"].startswith(f"PID {child.pid} [") and "blocked writing" in enriched.details["verdict"]
    facts = enriched.details["diagnosis"]["facts"]
    assert facts["case"] == "blocked_on_file" and facts["file"] == str(events) and facts["mount"] == str(fs.mountpoint)
    assert not HAN.search(json.dumps(enriched.details))


def test_diagnose_screen_in_chinese_and_english(stuck_trainer):
    child, _tid, events, fs = stuck_trainer
    clock, gpu = _gpu_holding(child.pid)
    _enriched, d = _stalled(gpu, clock, fs)
    zh, en = render(d, "zh"), render(d, "en")
    assert f"  结论：PID {child.pid} [" in zh and f"在写入 {events} 时阻塞" in zh and str(fs.mountpoint) in zh
    assert "  处理建议：TensorBoard 的 event writer" in zh
    assert "verdict:" not in zh and "remedy:" not in zh
    assert f"  verdict: {d.verdict}" in en and f"  remedy: {d.remedy}" in en and not HAN.search(en)


def test_diagnose_cli_speaks_the_configured_language_and_json_stays_facts(stuck_trainer, tmp_path):
    child, _tid, events, fs = stuck_trainer
    script = {"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                  "processes": [{"pid": child.pid, "used": 76 * GiB}]}])]}
    (tmp_path / "nvml.json").write_text(json.dumps(script))
    (tmp_path / "config.toml").write_text('[notify]\nlanguage = "zh"\n')
    env = dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{ROOT}/daemon",
               TRAINGUARD_FAKE_NVML=str(tmp_path / "nvml.json"))
    env.pop("TRAINGUARD_CONFIG", None)

    def diagnose(*extra: str) -> str:
        out = subprocess.run([sys.executable, "-m", "trainguard", "diagnose", "--wait", "0.2", *extra,
                              "--config", str(tmp_path / "config.toml")], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    text = diagnose()
    assert "结论：" in text and f"在写入 {events} 时阻塞" in text and "处理建议：" in text, text
    (d,) = json.loads(diagnose("--json"))["gpus"]
    assert "blocked writing" in d["verdict"] and not HAN.search(json.dumps(d))
    assert d["facts"]["case"] == "blocked_on_file" and d["facts"]["process"]["pid"] == child.pid
