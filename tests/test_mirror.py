"""The mirror on real directories and real child processes: local dir -> plain dir, appends, kills, ENOSPC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainguard import config as configmod
from trainguard.actions.mirror.globs import Matcher
from trainguard.actions.mirror.runner import COPIER, MirrorRunner
from trainguard.detectors import DetectorInput
from trainguard.detectors.mirror import detect
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import MirrorState, Snapshot
from trainguard.store.history import History
from trainguard.store.state import StateDb

from tests.support.cli import cli_env, trainguard
from tests.support.clock import FakeClock

EVENTS = "run1/events.out.tfevents.1700000000.host.1.0"


def mirror_cfg(source, dest, **extra) -> configmod.Config:
    table = {"name": "runs", "source": str(source), "dest": str(dest), **extra}
    return configmod.parse({"mirror": [table], "gpu": {"enabled": False}}, "test")


def runner_for(tmp_path, source, dest, clock=None, **extra) -> MirrorRunner:
    cfg = mirror_cfg(source, dest, **extra)
    (tmp_path / "state").mkdir(exist_ok=True)
    return MirrorRunner.open(cfg.mirror[0], StateDb(str(tmp_path / "state")).connect(), clock)


def write(path: Path, data: bytes, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def training_tree(src: Path) -> None:
    write(src / EVENTS, b"\x18\x00" * 1000, 1_700_000_000)
    write(src / "run1/ckpt/step-100.pt", os.urandom(3 * 2**20), 1_700_000_100)
    write(src / "run1/train.log", b"epoch 1 loss 0.3\n", 1_700_000_200)
    write(src / "run1/cache/batch.npy", b"not mirrored")


def test_patterns_span_directories_with_double_star():
    m = Matcher(["**/events.out.tfevents.*", "**/*.pt"], exclude=["**/tmp/**"])
    assert m("events.out.tfevents.1") and m("a/b/events.out.tfevents.1") and m("x.pt") and m("a/x.pt")
    assert not m("a/x.ptx") and not m("a/tmp/x.pt") and not m("a/b.log")
    assert Matcher(["**"])("any/thing") and Matcher(["run?/[!c]*.log"])("run1/a.log")
    assert not Matcher(["run?/[!c]*.log"])("run1/c.log")


def test_local_dir_is_mirrored_identically_and_only_once(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    training_tree(src)
    runner = runner_for(tmp_path, src, dst, patterns=["**/events.out.tfevents.*", "**/*.pt", "**/*.log"])
    state = runner.run()
    assert (state.pending_files, state.reason) == (0, "")
    for rel in (EVENTS, "run1/ckpt/step-100.pt", "run1/train.log"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
        assert (dst / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns
        assert (dst / rel).stat().st_mode == (src / rel).stat().st_mode
    assert not (dst / "run1/cache").exists(), "files outside the patterns stay local"
    assert not [p for p in dst.rglob("*") if "trainguard-tmp" in p.name]
    copied = state.bytes_total
    assert copied == sum((src / r).stat().st_size for r in (EVENTS, "run1/ckpt/step-100.pt", "run1/train.log"))
    from trainguard.actions.mirror.record import last_copy

    ckpt = (src / "run1/ckpt/step-100.pt").stat()
    recorded = last_copy(runner.record.conn, "runs", b"run1/ckpt/step-100.pt")
    assert (recorded.size, recorded.mtime_ns) == (ckpt.st_size, ckpt.st_mtime_ns), "cleanup can ask the record"
    assert last_copy(runner.record.conn, "runs", b"run1/cache/batch.npy") is None
    # A second round and a restarted daemon (a fresh runner on the same state db) copy nothing.
    assert runner.run().bytes_total == copied
    runner.record.conn.close()
    assert runner_for(tmp_path, src, dst, patterns=["**"], exclude=["**/cache/**"]).run().bytes_total == copied


def test_appended_event_file_is_copied_again_whole_and_atomically(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src / EVENTS, os.urandom(200_000))
    runner = runner_for(tmp_path, src, dst)
    before = runner.run().bytes_total
    inode = (dst / EVENTS).stat().st_ino
    with open(src / EVENTS, "ab") as f:
        f.write(b"record" * 1000)
    state = runner.run()
    assert (dst / EVENTS).read_bytes() == (src / EVENTS).read_bytes()
    assert (dst / EVENTS).stat().st_mtime_ns == (src / EVENTS).stat().st_mtime_ns
    assert state.bytes_total - before == 206_000
    # A new file renamed over the old one: a reader of the share never sees a half-written append.
    assert (dst / EVENTS).stat().st_ino != inode


def test_rewritten_file_is_replaced_whole_and_atomically(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src / "model.pt", b"A" * 100_000, 1_700_000_000)
    runner = runner_for(tmp_path, src, dst)
    runner.run()
    inode = (dst / "model.pt").stat().st_ino
    write(src / "model.pt", b"B" * 150_000, 1_700_000_100)  # grew, but its first bytes changed: not an append
    state = runner.run()
    assert (dst / "model.pt").read_bytes() == b"B" * 150_000
    assert (dst / "model.pt").stat().st_ino != inode, "a new file renamed over the old one"
    assert state.bytes_total == 250_000


def test_share_changed_behind_our_back_is_copied_over(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src / EVENTS, b"x" * 10_000)
    runner = runner_for(tmp_path, src, dst)
    runner.run()
    write(dst / EVENTS, b"x" * 5_000)  # e.g. truncated by hand on the share
    with open(src / EVENTS, "ab") as f:
        f.write(b"y" * 100)
    runner.run()
    assert (dst / EVENTS).read_bytes() == b"x" * 10_000 + b"y" * 100


def copier(request: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-S", str(COPIER)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=cli_env(), text=True)
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return proc


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_copier_killed_midway_leaves_the_old_copy_under_the_final_name(tmp_path, slowfs):
    src = tmp_path / "src"
    share = Path(slowfs.mountpoint)
    write(src / "ckpt.pt", b"old" * 1000)
    runner = runner_for(tmp_path, src, share)
    runner.run()
    write(src / "ckpt.pt", os.urandom(24 * 2**20))
    slowfs.delay("write", 0.01)  # every 128 KiB written to the share takes 10 ms: the copy takes about 2 s
    proc = copier({"source": str(src), "dest": str(share), "jobs": [{"rel": "ckpt.pt", "prev": None}]})
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["ev"] == "bytes":  # the first 8 MiB are on the share, 16 MiB to go
            break
    os.kill(proc.pid, signal.SIGKILL)  # mid-copy, after bytes reached the share
    proc.wait(10)
    slowfs.delay("write", 0)
    tmp = next(e["tmp"] for e in events if e["ev"] == "tmp")
    assert (share / tmp).exists(), f"the partial copy is under its temporary name: {events}"
    assert (share / "ckpt.pt").read_bytes() == b"old" * 1000, "the final name still holds the last whole copy"
    runner.record.temp_created(os.fsencode(tmp))  # what the supervisor records from the "tmp" line
    state = runner.run()
    assert state.pending_files == 0
    assert (share / "ckpt.pt").read_bytes() == (src / "ckpt.pt").read_bytes()
    assert not (share / tmp).exists(), "our own stale temporary file is removed; nothing else is"


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_a_hung_share_kills_the_copy_after_file_timeout_and_the_next_round_resumes(tmp_path, slowfs):
    src, share = tmp_path / "src", Path(slowfs.mountpoint)
    write(src / "run/ckpt.pt", os.urandom(2**20))
    clock = FakeClock()
    runner = runner_for(tmp_path, src, share, clock, file_timeout="30s")
    runner.poll = 0.05
    slowfs.block("write")

    result = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    slowfs.wait_blocked("write", timeout=10)
    deadline = time.monotonic() + 10
    while runner.activity[0] != "write" and time.monotonic() < deadline:  # the report line is on its way
        time.sleep(0.01)
    clock.advance(31)  # no progress for longer than file_timeout
    t.join(10)
    assert not t.is_alive(), "the supervisor killed the copier instead of waiting on the share"
    state = result[0]
    assert state.reason_kind == "unresponsive" and "write" in state.reason and "no progress for 30s" in state.reason
    assert state.pending_files == 1 and state.errors_total == 1
    assert not (share / "run/ckpt.pt").exists()
    slowfs.unblock("write")
    state = runner.run()
    assert (state.pending_files, state.reason) == (0, "")
    assert (share / "run/ckpt.pt").read_bytes() == (src / "run/ckpt.pt").read_bytes()
    assert not [p for p in share.rglob("*") if "trainguard-tmp" in p.name]


@pytest.mark.parametrize("tmpfs_mount", [2 * 2**20], indirect=True)
def test_a_full_share_is_the_reason_and_leaves_no_temporary_file(tmp_path, tmpfs_mount):
    src = tmp_path / "src"
    write(src / "big.pt", os.urandom(3 * 2**20))
    write(src / "small.log", b"ok\n")
    state = runner_for(tmp_path, src, tmpfs_mount).run()
    assert state.reason_kind == "full" and "dest full (ENOSPC)" in state.reason
    assert state.errors_total >= 1 and state.pending_files >= 1
    assert not [p for p in tmpfs_mount.rglob("*") if "trainguard-tmp" in p.name]


def test_a_copier_that_closes_its_output_and_stays_does_not_hold_the_round(tmp_path, monkeypatch):
    """A copier whose last thread sits in the share after its output closed (its report is over, the process
    is not) would keep the mirror thread waiting on it for as long as the share hangs: the round ends within
    EXIT_WAIT, the copier is killed, and the round names it."""
    from trainguard.actions.mirror import runner as runner_mod

    monkeypatch.setattr(runner_mod, "EXIT_WAIT", 0.5)
    src = tmp_path / "src"
    write(src / "a.log", b"x\n")
    runner = runner_for(tmp_path, src, tmp_path / "dest")
    stays = "import os, time; os.close(1); os.close(2); time.sleep(60)"
    spawned = []

    def spawn():
        proc = subprocess.Popen([sys.executable, "-c", stays], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(runner, "_spawn", spawn)
    started = time.monotonic()
    state = runner.run()
    assert time.monotonic() - started < 10
    [proc] = spawned
    assert proc.poll() == -signal.SIGKILL
    assert f"copier (pid {proc.pid}) closed its output and did not exit" in state.reason


def test_lag_warning_names_the_mirror_and_the_reason(tmp_path):
    cfg = mirror_cfg("/local/runs", "/share/runs", lag_warning="15m")
    now = 1_700_000_000.0
    history = History.from_config(None, cfg, now)

    def findings(state):
        return detect(DetectorInput(cfg, history, Snapshot(ts=now, mirrors=(state,)), now))

    waiting = MirrorState("runs", "/share/runs", now, oldest_pending=now - 899, pending_files=2,
                          reason="dest full (ENOSPC): /share/runs/x.pt", reason_kind="full")
    assert findings(waiting) == []
    late = MirrorState("runs", "/share/runs", now, oldest_pending=now - 901, pending_files=2,
                       reason="dest full (ENOSPC): /share/runs/x.pt", reason_kind="full")
    [f] = findings(late)
    assert f.key == "mirror.lag:runs" and f.severity.value == "warning"
    assert "runs" in f.summary and "15m" in f.summary and "dest full (ENOSPC)" in f.summary
    assert f.labels == {"mirror": "runs"} and "free space" in f.hint
    zh = texts_for(f, tr("zh"))  # the facts its renderer reads
    assert zh.fact == "同步 runs 已落后 15m" and zh.why.startswith("共享存储已满。") and not zh.fallback
    assert findings(MirrorState("runs", "/share/runs", now)) == [], "nothing pending: no lag"


def test_mirror_command_exits_0_when_copied_and_1_with_the_reason(tmp_path, tmpfs_mount):
    src = tmp_path / "src"
    write(src / "a.log", b"hello\n")
    config = tmp_path / "c.toml"
    config.write_text(f'[general]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[[mirror]]\nname = "runs"\nsource = "{src}"\ndest = "{tmpfs_mount}/runs"\n'
                      f'[[mirror]]\nname = "off"\nenabled = false\nsource = "{src}"\ndest = "{tmp_path}/off"\n')
    done = trainguard("-c", str(config), "mirror", "--once")
    assert done.returncode == 0, done.stderr
    assert "runs: everything on" in done.stdout and not (tmp_path / "off").exists()
    write(src / "big.pt", os.urandom(20 * 2**20))  # more than the 16 MiB share holds
    full = trainguard("-c", str(config), "mirror", "runs")
    assert full.returncode == 1
    [line] = full.stderr.strip().splitlines()
    assert line.startswith("runs: 1 files") and "dest full (ENOSPC)" in line
    unknown = trainguard("-c", str(config), "mirror", "nope")
    assert unknown.returncode == 2 and "no mirror named 'nope' (mirrors: runs, off)" in unknown.stderr
    status = trainguard("-c", str(config), "status", "--json")
    [doc] = [m for m in json.loads(status.stdout)["mirrors"] if m["name"] == "runs"]
    assert doc["pending_files"] == 1 and "ENOSPC" in doc["reason"] and doc["lag_seconds"] >= 0
    text = trainguard("-c", str(config), "status").stdout
    assert "Mirrors:" in text and "runs: " in text and "1 files" in text and "dest full (ENOSPC)" in text


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_a_crashed_share_daemon_is_reported_as_disconnected(tmp_path, slowfs):
    src = tmp_path / "src"
    write(src / "a.log", b"x" * 1000)
    slowfs.kill()  # the FUSE server dies: every call on the mount fails with ENOTCONN
    state = runner_for(tmp_path, src, Path(slowfs.mountpoint) / "runs").run()
    assert state.reason_kind == "unresponsive" and "disconnected (ENOTCONN)" in state.reason
    assert state.pending_files == 1 and state.errors_total == 1


def test_a_missing_source_is_the_reason_and_keeps_what_was_pending(tmp_path):
    runner = runner_for(tmp_path, tmp_path / "not-yet", tmp_path / "dst")
    state = runner.run()
    assert state.reason_kind == "error" and "unreadable: No such file or directory" in state.reason
    assert (state.pending_files, state.oldest_pending) == (0, None)


def test_names_that_are_not_utf8_are_copied_byte_for_byte(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    name = os.fsencode(src) + b"/run-\xff/loss-\xe9.log"
    os.makedirs(os.path.dirname(name))
    with open(name, "wb") as f:
        f.write(b"latin-1 name\n")
    state = runner_for(tmp_path, src, dst).run()
    assert (state.pending_files, state.reason) == (0, "")
    with open(os.fsencode(dst) + b"/run-\xff/loss-\xe9.log", "rb") as f:
        assert f.read() == b"latin-1 name\n"


@pytest.mark.parametrize(("table", "words"), [
    ({"patterns": ["/root/autodl-tmp/runs/*.pt"]}, "patterns entry '/root/autodl-tmp/runs/*.pt' must be a glob "
                                                   "relative to source"),
    ({"exclude": ["../other/**"]}, "exclude entry '../other/**' must be a glob relative to source"),
    ({"dest": "/local/runs/share"}, "dest '/local/runs/share' is inside source '/local/runs'"),
])
def test_bad_mirror_tables_get_one_line_naming_the_key(table, words):
    with pytest.raises(configmod.ConfigError) as caught:
        configmod.parse({"mirror": [{"name": "runs", "source": "/local/runs", "dest": "/share/runs", **table}]}, "t")
    assert words in str(caught.value)
