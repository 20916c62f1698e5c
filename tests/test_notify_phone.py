"""Phone-first messages: a short title with host and fact, the body in reading order, markdown DingTalk
renders, times with their offset; for every finding kind, in English and in Chinese."""

from __future__ import annotations

import json
import re

import pytest
from trainguard.i18n import tr
from trainguard.notify.messages import TITLE_MAX, compose
from trainguard.notify.texts import RENDERERS, texts_for
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity

from tests.test_i18n import finding_kinds_in_code

T0 = 1_800_000_000.0
GiB = 2**30
LONG_MP = "/root/autodl-tmp/experiments/llama-70b-sft/checkpoints"
EVENTS = "/mnt/juicefs/team/runs/llama-70b/events.out.tfevents.1764740000.gpu3.4242.0"
# The diagnosis facts diagnosis.verdict keeps (Diagnosis.facts), and the English it says them in.
STALL_FACTS = {"case": "blocked_on_file", "syscall": "write", "file": EVENTS, "fstype": "fuse.juicefs",
               "mount": "/mnt/juicefs", "kind": "fuse", "category": "tfevents", "unresponsive_s": 720.0,
               "process": {"pid": 4242, "command": "python3 train.py", "thread": "pt_main_thread",
                           "thread_os": "python3"}}
VERDICT = (f"PID 4242 [python3 train.py] thread pt_main_thread (python3) blocked writing {EVENTS} on fuse.juicefs "
           "at /mnt/juicefs, mount unresponsive 12m")
TFEVENTS_REMEDY = ("TensorBoard's event writer is stuck on the shared filesystem: log to local disk "
                   "(e.g. SummaryWriter('/tmp/runs')) and mirror it to the share with trainguard's [[mirror]] "
                   "(or rsync it in the background); if it must stay there, raise flush_secs and lower max_queue. "
                   "/mnt/juicefs is not answering: check its FUSE daemon; the job continues by itself if the "
                   "mount recovers")

# One finding per kind, with the details its detector sets (long names where a name can be long).
SAMPLES = {
    "fs.usage": Finding(f"fs.usage:{LONG_MP}", Severity.CRITICAL, "s", details={
        "mountpoint": LONG_MP, "fstype": "ext4", "used_bytes": 950 * GiB, "avail_bytes": 50 * GiB,
        "size_bytes": 1000 * GiB, "used_ratio": 0.95}, labels={"mountpoint": LONG_MP}),
    "fs.inodes": Finding("fs.inodes:/data", Severity.WARNING, "s", details={
        "mountpoint": "/data", "inodes_used": 9_500_000, "inodes_free": 500_000, "inodes_total": 10_000_000},
        value=0.95),
    "fs.forecast": Finding("fs.forecast:/data", Severity.CRITICAL, "s", details={
        "mountpoint": "/data", "eta_seconds": 7200, "fill_bytes_per_second": 12 * GiB / 3600,
        "avail_bytes": 24 * GiB, "used_ratio": 0.961, "fitted_span_seconds": 6 * 3600}),
    "fs.unresponsive": Finding("fs.unresponsive:/mnt/juicefs", Severity.CRITICAL, "s", details={
        "mountpoint": "/mnt/juicefs", "fstype": "fuse.juicefs", "source": "JuiceFS:team", "kind": "fuse",
        "stuck_seconds": 754.0}),
    "fs.error": Finding("fs.error:/mnt/nfs", Severity.WARNING, "/mnt/nfs: cannot read usage: ESTALE",
                        details={"mountpoint": "/mnt/nfs", "error": "ESTALE"}),
    "fs.path_missing": Finding("fs.path_missing:/data/out", Severity.WARNING, "s", details={"path": "/data/out"}),
    "disk.saturated": Finding("disk.saturated:nvme0n1", Severity.WARNING, "s", details={
        "device": "nvme0n1", "mountpoints": ["/data", "/scratch"], "util_ratio": 0.97,
        "read_bytes_per_s": 10e6, "write_bytes_per_s": 900e6, "await_ms": 41.0}),
    "gpu.stall": Finding("gpu.stall:3", Severity.CRITICAL, "s", details={
        "gpu": 3, "uuid": "GPU-x", "name": "NVIDIA H100 80GB HBM3", "memory_used_bytes": 78 * GiB,
        "memory_total_bytes": 80 * GiB, "util_mean_ratio": 0.0, "util_recent": [0.0] * 30,
        "stalled_since": T0 - 1900, "stalled_for_s": 1900.0, "processes": [], "verdict": VERDICT,
        "diagnosis": {"verdict": VERDICT, "remedy": TFEVENTS_REMEDY, "facts": STALL_FACTS}}, labels={"gpu": "3"}, hint=TFEVENTS_REMEDY),
    "gpu.orphan": Finding("gpu.orphan:1:4242", Severity.WARNING, "s", details={
        "gpu": 1, "host_pid": 4242, "pid": None, "state": None, "used_memory_bytes": 30 * GiB}),
    "gpu.xid": Finding("gpu.xid:0", Severity.CRITICAL, "s", details={"gpu": 0, "uuid": "u", "xids": [13, 48],
                                                                    "last_ts": T0}, value=48.0),
    "gpu.throttle": Finding("gpu.throttle:2", Severity.WARNING, "s", details={
        "gpu": 2, "reasons": ["hw_thermal", "sw_thermal"], "share": 0.96, "temperature_c": 91.0,
        "power_w": 350.0, "power_limit_w": 700.0}),
    "log.match": Finding("log.match:/data/runs/llama-70b-sft/train.log#No space left on device", Severity.CRITICAL,
                         "/data/runs/llama-70b-sft/train.log: OSError: [Errno 28] No space left on device",
                         details={"file": "/data/runs/llama-70b-sft/train.log", "count": 3, "lines": [],
                                  "pattern": "No space left on device"},
                         hint="a write failed because a filesystem is full: free space "
                              "(trainguard cleanup --dry-run) and resume"),
    "cleanup.guard": Finding("cleanup.guard:checkpoints", Severity.WARNING,
                             "cleanup checkpoints stopped, nothing deleted: would delete 412 files, max_delete is 200",
                             details={"roots": [], "trigger": "usage", "skipped": {}, "blocked": [],
                                      "planned_files": 412, "planned_bytes": 310 * GiB},
                             labels={"policy": "checkpoints"}),
    "cleanup.bounded": Finding("cleanup.bounded:pip", Severity.WARNING, "s", details={
        "roots": [{"root": "/root/.cache/pip", "mount": "/", "files": 10000, "bytes": 39 * 2**20}],
        "trigger": "watermark", "skipped": {}, "needed_files": 14336, "needed_bytes": 56 * 2**20,
        "left_bytes": 17 * 2**20, "max_delete": "10000 files", "goal": "low", "goal_value": 0.3},
        labels={"policy": "pip", "mountpoint": "/"}),
    "cleanup.report": Finding("cleanup.report:checkpoints", Severity.INFO, "s", details={
        "roots": [{"root": "/data/ckpt", "mount": "/data", "files": 12, "bytes": 96 * GiB}],
        "trigger": "usage", "skipped": {}}, labels={"policy": "checkpoints", "mountpoint": "/data"}),
    "cleanup.blocked": Finding("cleanup.blocked:hf-cache", Severity.WARNING, "s", details={
        "roots": [], "trigger": "usage", "skipped": {}, "planned_files": 0, "planned_bytes": 0,
        "blocked": ["/root/.cache/huggingface is read-only for trainguard (mounted read-only here)"],
        "blocked_paths": [{"path": "/root/.cache/huggingface", "why": "read-only"}]},
        labels={"policy": "hf-cache"}),
    "cleanup.unverified": Finding("cleanup.unverified:tmp", Severity.WARNING, "s", details={
        "roots": [], "trigger": "schedule", "skipped": {"unverifiable-open": 37}, "blocked": [],
        "planned_files": 0, "planned_bytes": 0, "uninspected": 12, "unverifiable": 37}, labels={"policy": "tmp"}),
    "fs.next_checkpoint": Finding(f"fs.next_checkpoint:{LONG_MP}", Severity.CRITICAL, "s", details={
        "mountpoint": LONG_MP, "checkpoint_bytes": 140 * GiB, "needed_bytes": 154 * GiB, "avail_bytes": 150 * GiB,
        "used_ratio": 0.85, "avail_at_next_bytes": 131 * GiB, "next_write_ts": T0 + 1500,
        "next_write_in_seconds": 1500, "every_seconds": 3600, "roots": [LONG_MP]}, labels={"mountpoint": LONG_MP}),
    "gpu.risky_write": Finding("gpu.risky_write:4242:/mnt/juicefs", Severity.INFO, "s", details={
        "pid": 4242, "gpu": 3, "cmdline": "/usr/bin/python3 /root/code/train.py --lr 3e-4",
        "mountpoint": "/mnt/juicefs", "fstype": "fuse.juicefs",
        "files": ["/mnt/juicefs/team/runs/llama-70b/events.out.tfevents.1764740000.gpu3.4242.0",
                  "/mnt/juicefs/team/runs/llama-70b/train.log"],
        "categories": ["log", "tfevents"], "attribution": "nvml"}, labels={"mountpoint": "/mnt/juicefs", "gpu": "3"}),
    "train.hang": Finding("train.hang:torchrun-4121", Severity.CRITICAL, "s", details={
        "run": "torchrun-4121", "gpu_evidence": "spinning", "silent_for_s": 745.0, "timeout_s": 300.0,
        "normal_gap_s": 42.0, "last_progress_ts": T0 - 745, "gpus": [0, 1, 2, 3],
        "ranks": [{"rank": r, "pid": 4122 + r, "gpu": r, "last_progress_ts": T0 - 745, "cpu_s": 81.5}
                  for r in range(4)],
        "holder": {"rank": 2, "pid": 4124, "frame": "DataLoader.__next__", "file": "/root/autodl-fs/data/x.bin",
                   "mount": "/root/autodl-fs"},
        "waiting_ranks": [0, 1, 3], "collective": "all_reduce",
        "stalls": [{"gpu": 2, "stalled_for_s": 600.0}]}, labels={"run": "torchrun-4121"}),
    "train.exit": Finding("train.exit:torchrun-4121", Severity.WARNING, "s", details={
        "run": "torchrun-4121", "run_id": "4121@99", "ended_ts": T0,
        "error": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED"},
        labels={"run": "torchrun-4121"}),
    "mirror.lag": Finding("mirror.lag:runs", Severity.WARNING, "s", details={
        "mirror": "runs", "dest": "/mnt/juicefs/team/runs", "lag_s": 1830.0, "pending_files": 14,
        "pending_bytes": 3 * GiB, "reason": "statfs timed out", "reason_kind": "unresponsive"},
        labels={"mirror": "runs"}, value=1830.0, threshold=900.0),
    "state.unwritable": Finding("state.unwritable:/var/lib/trainguard", Severity.WARNING, "s", details={
        "state_dir": "/var/lib/trainguard", "error": "database or disk is full", "parts": ["history", "outbox"],
        "since": T0 - 600}, labels={"state_dir": "/var/lib/trainguard"}),
    "guard.wont-fit": Finding("guard.wont-fit:/data/ckpt/step-9000.pt", Severity.CRITICAL, "s", details={
        "pid": 4242, "source": "transformers", "bytes": 140 * GiB, "avail": 90 * GiB, "reserve": 10 * GiB,
        "message": "", "ts": T0}, labels={"mountpoint": "/data", "path": "/data/ckpt/step-9000.pt"}),
    "guard.stopped": Finding("guard.stopped:/data/ckpt/step-9000.pt", Severity.CRITICAL, "s", details={
        "pid": 4242, "source": "save_checkpoint", "bytes": 140 * GiB, "avail": 150 * GiB, "reserve": 10 * GiB,
        "message": "", "ts": T0}, labels={"mountpoint": "/data", "path": "/data/ckpt/step-9000.pt"}),
    "guard.fallback": Finding("guard.fallback:/scratch/ckpt/step-9000.pt", Severity.WARNING, "s", details={
        "pid": 4242, "source": "lightning", "bytes": 140 * GiB, "avail": 90 * GiB, "reserve": None,
        "message": "", "ts": T0}, labels={"mountpoint": "/scratch", "path": "/scratch/ckpt/step-9000.pt"}),
    "trainguard.test": Finding("trainguard.test", Severity.WARNING, "s", details={"host": "gpu3"}),
}
HOST = "gpu-node-03"
OFFSET_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d [+-]\d\d:\d\d")


def test_there_is_a_sample_of_every_kind():
    assert set(SAMPLES) == set(finding_kinds_in_code()) | set(RENDERERS) - {"x"}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_kind_makes_a_short_title_and_a_body_in_reading_order(kind, lang):
    f = SAMPLES[kind]
    t = texts_for(f, tr(lang))
    assert not t.fallback, f"{kind}: renderer failed on the detector's details"
    m = compose(HOST, [AlertEvent(AlertStatus.FIRING, f, started_at=T0, ts=T0 + 60)], lang)
    assert len(m.title) <= TITLE_MAX and m.title.startswith(f"{HOST} "), m.title
    assert "\n" not in m.title
    body = m.markdown
    assert m.title not in body and body.splitlines()[0] != t.fact  # the headline is not repeated
    assert body.startswith(t.what.replace("`", ""))  # what happened comes first ...
    positions = [body.index(x) for x in (t.what, t.why, t.step) if x]
    assert positions == sorted(positions)  # ... then why, then the next step
    assert OFFSET_TIME.search(body) and " CST" not in body
    if lang == "zh":
        assert re.search(r"[\u4e00-\u9fff]", m.title) or kind in ("gpu.xid",)
        if t.step:
            assert "**下一步：**" in body


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_markdown_stays_in_what_dingtalk_renders(lang):
    events = [AlertEvent(AlertStatus.FIRING, f, started_at=T0, ts=T0) for f in SAMPLES.values()]
    events.append(AlertEvent(AlertStatus.RESOLVED, SAMPLES["fs.usage"], started_at=T0 - 3600, ts=T0))
    m = compose(HOST, events, lang)
    assert len(m.title) <= TITLE_MAX
    for line in m.markdown.splitlines():
        assert "`" not in line, line  # no inline code: DingTalk shows the backticks
        assert not line.lstrip().startswith("|"), line  # no tables
        assert not re.search(r"<[a-z/][^>]*>", line), line  # no HTML
        assert not line.startswith("#") or line.startswith("#### "), line  # headings the sender does not use
        assert not line.startswith(("```", "    ")), line  # no code blocks


def test_the_stall_title_is_short_now():
    m = compose("gpu-07", [AlertEvent(AlertStatus.FIRING, SAMPLES["gpu.stall"], started_at=T0, ts=T0)])
    assert m.title == "gpu-07 GPU 3 stalled for 31m"
    assert "Diagnosis: PID 4242" in m.text
    zh = compose("gpu-07", [AlertEvent(AlertStatus.FIRING, SAMPLES["gpu.stall"], started_at=T0, ts=T0)], "zh")
    assert zh.title == "gpu-07 GPU 3 已空转 31m"
    assert "下一步：TensorBoard 的 event writer 卡在共享文件系统上" in zh.text


def test_resolved_in_chinese_says_what_recovered_and_how_long_it_lasted():
    m = compose("gpu3", [AlertEvent(AlertStatus.RESOLVED, SAMPLES["fs.forecast"], started_at=T0, ts=T0 + 7500)], "zh")
    assert m.title == "gpu3 /data 磁盘空间已恢复，持续了 2h05m"
    assert m.text.startswith("已恢复正常。最后一次看到：/data 已用 96.1%")
    assert "下一步" not in m.text and "原因" not in m.text
    assert "已恢复 · " in m.text and OFFSET_TIME.search(m.text)


def test_the_zh_stall_verdict_is_said_from_the_facts():
    zh = compose("gpu-07", [AlertEvent(AlertStatus.FIRING, SAMPLES["gpu.stall"], started_at=T0, ts=T0)], "zh")
    assert (f"原因：诊断：PID 4242 [python3 train.py] 的线程 pt_main_thread (python3) 在写入 {EVENTS} 时阻塞"
            "（fuse.juicefs，挂载点 /mnt/juicefs），该挂载已 12m 无响应。") in zh.text
    assert "下一步：TensorBoard 的 event writer 卡在共享文件系统上" in zh.text
    assert "/mnt/juicefs 没有响应：检查它的 FUSE 守护进程" in zh.text
    assert "blocked" not in zh.text and "Diagnosis" not in zh.text
    assert zh.payload["details"]["verdict"] == VERDICT and zh.payload["hint"] == TFEVENTS_REMEDY  # JSON: English


def test_a_stall_queued_without_facts_still_reads_in_order():
    """An alert queued by a version before the facts: its English verdict, the generic step first in zh."""
    old = Finding("gpu.stall:3", Severity.CRITICAL, "s", details={
        **{k: v for k, v in SAMPLES["gpu.stall"].details.items() if k != "diagnosis"}, "diagnosis": {}},
        labels={"gpu": "3"}, hint="an untranslated remedy")
    en = texts_for(old, tr("en"))
    zh = texts_for(old, tr("zh"))
    assert en.why == f"Diagnosis: {VERDICT}." and en.step == "an untranslated remedy"
    assert zh.why == f"诊断：{VERDICT}。" and zh.step.startswith("运行 trainguard diagnose 3") and not zh.fallback


PROC = {"pid": 77, "command": "python train.py", "thread": "MainThread", "thread_os": "python"}
REMOTE = {"file": "/mnt/nfs/ckpt/step-100.pt", "fstype": "nfs4", "mount": "/mnt/nfs", "kind": "network",
          "category": "checkpoint", "unresponsive_s": 300.0}
VERDICT_CASES = [
    {"case": "blocked_on_file", "process": PROC, "syscall": "fsync", **REMOTE},
    {"case": "blocked_on_file", "process": PROC, "syscall": "ioctl", "file": "/data/x.bin", "mount": "/data"},
    {"case": "blocked_on_file", "process": {**PROC, "inferred": "holds /dev/nvidia0 open"}, "syscall": "write",
     "file": "/data/x.log", "mount": None},
    {"case": "blocked_with_remote_file", "process": PROC, "wait": "request_wait_answer",
     **REMOTE, "category": "log", "kind": "fuse", "unresponsive_s": None},
    {"case": "blocked", "process": PROC, "wait": "", "state": "D"},
    {"case": "no_process", "log": "RuntimeError: NCCL timeout"},
    {"case": "not_inspectable", "why": "PID 4242 is not in this PID namespace"},
    {"case": "io_moving", "process": PROC},
    {"case": "log_error", "log": "RuntimeError: CUDA error: an illegal memory access"},
    {"case": "idle"},
    {"case": "timed_out", "deadline_s": 5.0, "unresponsive_mounts": ["/mnt/a", "/mnt/b"]},
]


@pytest.mark.parametrize("facts", VERDICT_CASES, ids=lambda f: f["case"])
def test_every_verdict_and_remedy_reads_in_chinese(facts):
    from trainguard.diagnosis.words import remedy_text, verdict_text

    for say in (verdict_text, remedy_text):
        en, zh = say(facts, tr("en")), say(facts, tr("zh"))
        assert re.search(r"[\u4e00-\u9fff]", zh) and zh != en, (say.__name__, zh)
        assert not re.search(r"\b(blocked|writing|syncing|mount unresponsive|no thread|cannot)\b", zh), zh
        for fact in (facts.get("file"), facts.get("mount"), (facts.get("process") or {}).get("command")):
            if fact and fact in en:
                assert fact in zh  # paths and commands unchanged


def test_a_credential_in_a_watched_log_line_never_reaches_a_message():
    from trainguard.detectors.gpu import detect_log_matches
    from trainguard.records import LogMatch, Snapshot

    line = ("requests.exceptions.HTTPError: 401 Client Error for url: "
            "https://bot:hunter2pass@hub.example.com/api/models?token=hf_SeCrEt123456 No space left on device")
    snap = Snapshot(ts=T0, log_matches=(LogMatch("/data/train.log", line, "No space left on device", T0),))
    (found,) = detect_log_matches([], snap)
    assert found.key == "log.match:/data/train.log#No space left on device"
    # An alert queued before the detector scrubbed its lines is scrubbed where the message quotes it.
    queued = Finding(found.key, found.severity, f"/data/train.log: {line}", details={**found.details, "lines": []},
                     labels=found.labels, hint=found.hint)
    for f in (found, queued):
        for lang in ("en", "zh"):
            m = compose(HOST, [AlertEvent(AlertStatus.FIRING, f, started_at=T0, ts=T0)], lang)
            shown = m.title + m.text + m.markdown
            assert "hunter2pass" not in shown and "hf_SeCrEt123456" not in shown, shown
            assert "hub.example.com/api/models" in shown  # the rest of the line stays readable
    wire = json.dumps(compose(HOST, [AlertEvent(AlertStatus.FIRING, found, started_at=T0, ts=T0)]).payload)
    assert "hunter2pass" not in wire and "hf_SeCrEt123456" not in wire


def test_the_findings_the_code_builds_carry_what_their_renderers_read(tmp_path):
    """The renderers read facts from details: built by the real code, no kind falls back to English."""
    from trainguard import guardspool
    from trainguard.actions.cleanup.record.report import (
        CleanupReport,
        RootReport,
        findings_for,
    )
    from trainguard.actions.guard_inbox import FINDING_KINDS, finding_for
    from trainguard.diagnosis.model import FileView
    from trainguard.diagnosis.placement import GpuProcessRef, _finding
    from trainguard.store.writes import WriteProblem, unwritable_finding

    ckpt = str(tmp_path / "ckpt" / "step-9000.pt")
    built = [finding_for(guardspool.GuardEvent(T0, kind.split(".", 1)[1], ckpt, 4242, 140 * GiB, 90 * GiB))
             for kind in FINDING_KINDS]
    built.append(unwritable_finding(WriteProblem(T0, "database or disk is full", ("history",)), "/var/lib/tg", T0))
    report = CleanupReport("ckpt", "checkpoints", "watermark", False, T0, T0 + 1,
                           (RootReport(str(tmp_path), "/data", 3, 9 * GiB),), 0, 0, guard="412 files would exceed",
                           planned_files=412, planned_bytes=310 * GiB, blocked=(f"{tmp_path} is read-only",))
    built += findings_for(report)
    built += findings_for(CleanupReport("pip", "pip-cache", "watermark", False, T0, T0 + 1,
                                        (RootReport(str(tmp_path), "/data", 10, 40960),), 10, 40960,
                                        bounded="max_delete 10 files reached", needed_files=25, needed_bytes=102400,
                                        max_delete="10 files", goal="max_size", goal_value=2**20))
    view = FileView(5, "/mnt/nfs/runs/events.out.tfevents.1", "tfevents", "/mnt/nfs", "nfs4", "network", None, True)
    built.append(_finding(GpuProcessRef(4242, 1), "python3 train.py", "/mnt/nfs", [view]))
    assert {f.kind for f in built} >= {*FINDING_KINDS, "state.unwritable", "cleanup.guard", "cleanup.blocked",
                                       "cleanup.bounded", "gpu.risky_write"}
    for f in built:
        for lang in ("en", "zh"):
            assert not texts_for(f, tr(lang)).fallback, (f.kind, lang)


def test_a_credential_in_a_log_line_the_diagnosis_quotes_is_scrubbed_everywhere_it_goes():
    from trainguard.diagnosis.render import render
    from trainguard.diagnosis.verdict import build_diagnosis, timed_out
    from trainguard.records import GpuSample, LogMatch

    line = "wandb: ERROR api_key=0123456789abcdef0123 rejected (https://u:pw-s3cret@api.example.com/x)"
    logs = [LogMatch("/data/train.log", line, "ERROR", T0)]
    gpu = GpuSample(0, "GPU-x", "H100", T0, memory_used_bytes=70 * GiB, memory_total_bytes=80 * GiB)
    for d in (build_diagnosis(gpu, [], logs), timed_out(gpu, (), logs, 5.0)):
        shown = json.dumps(d.to_dict()) + render(d, "en") + render(d, "zh")
        assert "0123456789abcdef0123" not in shown and "pw-s3cret" not in shown, shown
        assert "api.example.com/x" in d.verdict and "日志：wandb: ERROR" in render(d, "zh")
