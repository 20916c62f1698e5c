"""trainguard.guard: will the next checkpoint fit, and a save that a full disk or a crash cannot tear.

The filling tests run on a real tmpfs or loop-mounted ext4 (root); the rest on tmp_path.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard import guardspool
from trainguard.guard import (
    CheckpointWontFit,
    previous_checkpoint,
    save_checkpoint,
    will_fit,
)
from trainguard.guard.space import TEMP_MARK, family_pattern, reserve_bytes

from tests.support.mounts import fill

MiB = 2**20
HEAVY = ("pydantic", "apprise", "prometheus_client", "sqlite3", "torch")


def blob(n: int, seed: int = 1) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (n // 32) + b"x" * (n % 32)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temps(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TEMP_MARK in n)


def daemon_dir(tmp_path: Path) -> Path:
    """A state directory as a daemon leaves it (its database is what says a daemon is there)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.db").touch()
    return state


def test_importing_the_guard_loads_nothing_heavy():
    code = f"import sys, trainguard.guard; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_family_pattern_and_reserve_forms():
    assert family_pattern("model_12.pt") == "model_*.pt"
    assert family_pattern("checkpoint-500") == "checkpoint-*"
    assert reserve_bytes("5%", 1000 * MiB) == 50 * MiB
    assert reserve_bytes("2MiB", 10) == 2 * MiB
    assert reserve_bytes(0.25, 400) == 100
    assert reserve_bytes(None, 10 * 2**40) == 2**30  # 1 %, at most 1 GiB
    with pytest.raises(ValueError, match="reserve .*lots.* is not a size"):
        reserve_bytes("lots", 100)


def test_previous_checkpoint_is_the_newest_of_the_family_file_or_directory(tmp_path):
    for step, size in ((100, 3000), (200, 5000)):
        (tmp_path / f"model_{step}.pt").write_bytes(b"x" * size)
    (tmp_path / "notes.txt").write_bytes(b"x" * 99999)
    path, nbytes = previous_checkpoint(tmp_path / "model_300.pt")
    assert path.endswith("model_200.pt") and nbytes >= 5000
    run = tmp_path / "run"
    for step in (10, 20):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"y" * 7000 * step)
    path, nbytes = previous_checkpoint(run)  # the run's output directory: its newest checkpoint-*
    assert path.endswith("checkpoint-20") and nbytes >= 140000
    assert previous_checkpoint(tmp_path / "fresh" / "model_1.pt") is None


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [8 * MiB], indirect=True)
def test_will_fit_uses_the_previous_checkpoint_and_keeps_the_reserve(tmpfs_mount):
    (tmpfs_mount / "model_1.pt").write_bytes(blob(3 * MiB))
    fit = will_fit(tmpfs_mount / "model_2.pt", reserve=0)
    assert fit and fit.need >= 3 * MiB and fit.previous.endswith("model_1.pt")
    assert 4 * MiB < fit.avail <= 5 * MiB
    assert will_fit(tmpfs_mount / "model_2.pt", reserve="1MiB")
    assert not will_fit(tmpfs_mount / "model_2.pt", reserve="3MiB")
    short = will_fit(tmpfs_mount / "model_2.pt", reserve="50%")
    assert not short and short.short_by > 0 and "will not fit" in str(short.error())


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [8 * MiB], indirect=True)
def test_save_that_does_not_fit_raises_and_leaves_the_previous_intact(tmpfs_mount):
    first = save_checkpoint(blob(3 * MiB), tmpfs_mount / "model_1.pt", reserve=0)
    assert first.bytes >= 3 * MiB and not first.removed
    before = digest(tmpfs_mount / "model_1.pt")
    fill(tmpfs_mount / "other-writer.log", 3 * MiB)  # something else took the room
    with pytest.raises(CheckpointWontFit) as err:
        save_checkpoint(blob(3 * MiB, 2), tmpfs_mount / "model_2.pt", reserve=0)
    assert err.value.need >= 3 * MiB and err.value.avail < err.value.need
    assert "model_2.pt will not fit" in str(err.value)
    assert digest(tmpfs_mount / "model_1.pt") == before
    assert not (tmpfs_mount / "model_2.pt").exists() and temps(tmpfs_mount) == []


@pytest.mark.root
@pytest.mark.parametrize("ext4_mount", [16 * MiB], indirect=True)
def test_disk_filling_during_the_write_removes_the_temp_file(ext4_mount):
    save_checkpoint(blob(2 * MiB), ext4_mount / "model_1.pt", reserve=0)
    before = digest(ext4_mount / "model_1.pt")
    chunks = [blob(MiB, i) for i in range(40)]  # far more than the disk holds; the estimate says 2 MiB

    def writer(f):
        for chunk in chunks:
            f.write(chunk)

    with pytest.raises(CheckpointWontFit) as err:
        save_checkpoint(writer, ext4_mount / "model_2.pt", reserve=0)
    assert err.value.written > 2 * MiB and "disk filled after" in str(err.value)
    assert isinstance(err.value.__cause__, OSError)
    assert temps(ext4_mount) == [] and not (ext4_mount / "model_2.pt").exists()
    assert digest(ext4_mount / "model_1.pt") == before
    save_checkpoint(blob(2 * MiB, 3), ext4_mount / "model_2.pt", reserve=0)  # the space came back


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [8 * MiB], indirect=True)
def test_keep_last_makes_room_from_doomed_ones_but_never_the_newest(tmpfs_mount):
    for step in (1, 2):
        save_checkpoint(blob(2 * MiB, step), tmpfs_mount / f"model_{step}.pt", keep_last=2, reserve=0)
    fill(tmpfs_mount / "dataset.cache", 3 * MiB)
    # model_1 goes anyway once model_3 exists (keep_last=2): it is deleted first to make room.
    saved = save_checkpoint(blob(2 * MiB, 3), tmpfs_mount / "model_3.pt", keep_last=2, reserve=0)
    assert [Path(p).name for p, _ in saved.removed] == ["model_1.pt"]
    assert sorted(os.listdir(tmpfs_mount)) == ["dataset.cache", "model_2.pt", "model_3.pt"]
    newest = digest(tmpfs_mount / "model_3.pt")
    # keep_last=1 would delete model_2 and model_3 once model_4 is complete: model_2 may go early,
    # model_3 (the last good one) may not. Without it there is no room, so nothing is deleted.
    fill(tmpfs_mount / "dataset.cache", 2 * MiB)
    with pytest.raises(CheckpointWontFit):
        save_checkpoint(blob(4 * MiB, 4), tmpfs_mount / "model_4.pt", keep_last=1, nbytes=4 * MiB, reserve=0)
    assert sorted(os.listdir(tmpfs_mount)) == ["dataset.cache", "model_2.pt", "model_3.pt"]
    assert digest(tmpfs_mount / "model_3.pt") == newest


def test_keep_last_applies_after_the_save_in_step_order(tmp_path):
    for step in (5, 10, 15, 20, 100):
        save_checkpoint(blob(1000, step), tmp_path / f"model_{step}.pt", keep_last=3, reserve=0)
    (tmp_path / "model_final.pt").write_bytes(b"kept: another family")
    assert sorted(os.listdir(tmp_path)) == ["model_100.pt", "model_15.pt", "model_20.pt", "model_final.pt"]


def test_writer_error_leaves_no_temp_and_no_final_name(tmp_path):
    save_checkpoint(b"good", tmp_path / "model_1.pt")

    def broken(f):
        f.write(b"half")
        raise RuntimeError("serialiser failed")

    with pytest.raises(RuntimeError, match="serialiser failed"):
        save_checkpoint(broken, tmp_path / "model_1.pt", keep_last=1)
    assert (tmp_path / "model_1.pt").read_bytes() == b"good" and temps(tmp_path) == []


KILLED_WRITER = """
import os, sys, time
from trainguard.guard import save_checkpoint
def writer(f):
    f.write(b"x" * 100000); f.flush()
    print("writing", flush=True)
    time.sleep(60)
save_checkpoint(writer, sys.argv[1])
"""


def test_a_save_killed_mid_write_never_shows_under_the_final_name(tmp_path):
    target = tmp_path / "model_1.pt"
    target.write_bytes(b"last good")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(10)
    assert target.read_bytes() == b"last good"
    assert len(temps(tmp_path)) == 1  # what a kill leaves behind ...
    save_checkpoint(b"next", target)
    assert temps(tmp_path) == [] and target.read_bytes() == b"next"  # ... the next save clears


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [4 * MiB], indirect=True)
def test_fallback_directory_takes_the_save_that_does_not_fit(tmpfs_mount, tmp_path):
    state = daemon_dir(tmp_path)
    (tmpfs_mount / "model_1.pt").write_bytes(blob(3 * MiB))
    saved = save_checkpoint(blob(3 * MiB, 2), tmpfs_mount / "model_2.pt", fallback_dir=tmp_path / "spill",
                            reserve=0, state_dir=str(state))
    assert saved.fallback and saved.path == str(tmp_path / "spill" / "model_2.pt")
    assert digest(Path(saved.path)) == hashlib.sha256(blob(3 * MiB, 2)).hexdigest()
    assert not (tmpfs_mount / "model_2.pt").exists()
    events, bad = guardspool.drain(str(state / guardspool.GUARD_EVENTS_FILE))
    assert bad == 0 and [e.kind for e in events] == ["fallback"] and events[0].path == saved.path


def test_directory_checkpoints_are_written_whole_and_pruned_as_units(tmp_path):
    def save_pretrained(step):
        def write(directory):
            Path(directory, "config.json").write_text(json.dumps({"step": step}))
            Path(directory, "model.safetensors").write_bytes(blob(5000, step))
        return write

    for step in (10, 20, 30):
        save_checkpoint(save_pretrained(step), tmp_path / f"checkpoint-{step}", directory=True, keep_last=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-20", "checkpoint-30"]
    save_checkpoint(save_pretrained(31), tmp_path / "checkpoint-30", directory=True, keep_last=2)  # overwrite
    assert json.loads((tmp_path / "checkpoint-30" / "config.json").read_text()) == {"step": 31}
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-20", "checkpoint-30"]


def test_save_fn_and_path_writers(tmp_path):
    def save_fn(obj, f):
        f.write(json.dumps(obj).encode())

    save_checkpoint({"w": [1, 2]}, tmp_path / "a.ckpt", save_fn=save_fn)
    save_checkpoint(lambda p: Path(p).write_text("by path"), tmp_path / "b.ckpt", pass_path=True)
    assert json.loads((tmp_path / "a.ckpt").read_text()) == {"w": [1, 2]}
    assert (tmp_path / "b.ckpt").read_text() == "by path"
    with pytest.raises(TypeError, match="save_fn=torch.save"):
        save_checkpoint({"w": 1}, tmp_path / "c.ckpt")


def test_events_reach_the_daemon_spool_only_when_there_is_a_daemon(tmp_path):
    state = daemon_dir(tmp_path)
    for step in (1, 2):
        save_checkpoint(b"x" * 1000, tmp_path / f"m_{step}.pt", keep_last=1, state_dir=str(state))
    events, bad = guardspool.drain(str(state / guardspool.GUARD_EVENTS_FILE))
    assert bad == 0 and [e.kind for e in events] == ["saved", "saved"]
    assert events[1].removed == ((str(tmp_path / "m_1.pt"), events[1].removed[0][1]),)
    assert events[1].pid == os.getpid() and events[1].bytes >= 1000
    assert guardspool.drain(str(state / guardspool.GUARD_EVENTS_FILE)) == ([], 0)  # drained means gone
    empty = tmp_path / "no-daemon"
    empty.mkdir()
    save_checkpoint(b"x", tmp_path / "m_3.pt", state_dir=str(empty / "missing"))
    assert list(empty.iterdir()) == []


def test_spool_skips_malformed_lines_and_stops_growing(tmp_path):
    spool = str(tmp_path / guardspool.GUARD_EVENTS_FILE)
    event = guardspool.GuardEvent(1.0, "saved", "/x", 1)
    assert guardspool.append(spool, event) is None
    with open(spool, "a") as fh:
        fh.write("not json\n{\"kind\": \"saved\"}\n")
    events, bad = guardspool.drain(spool)
    assert events == [event] and bad == 2
    with open(spool, "wb") as fh:
        fh.write(b" " * guardspool.MAX_BYTES)
    assert "is full" in guardspool.append(spool, event)
