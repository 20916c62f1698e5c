"""A checkpoint or cache unit left under a private name by a crash between the steps of a set-aside
(engine/aside.py) is collected by the next run: put back under the name it carries when that name is
free (it may be a save that slipped in between the judgment and the rename), else judged as a leftover.

The crash is simulated by leaving such a name, as the set-aside's first step does, on a real filesystem."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from trainguard import config
from trainguard.actions.cleanup.engine.leftover import carried_name
from trainguard.actions.cleanup.engine.quarantine import PREFIX, private_name
from trainguard.actions.cleanup.runner import CleanupRunner

OLD = time.time() - 30 * 86400


def _file(path: Path, mtime: float, data: bytes = b"x" * 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def _run(doc: dict, dry_run: bool = False):
    pol = config.parse({"cleanup": [doc]}, "test").cleanup[0]
    return CleanupRunner([pol], homes=frozenset()).run(pol, dry_run=dry_run)


def _private(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob(f"{PREFIX}*"))


def test_the_name_a_private_name_carries():
    assert carried_name(f"{PREFIX}1f.0.last.ckpt") == "last.ckpt"
    assert carried_name(f"{PREFIX}1f.a.{PREFIX}2.3.x") == f"{PREFIX}2.3.x"  # set aside twice: one step back
    for bare in (f"{PREFIX}1f.0", f"{PREFIX}1f.0.", f"{PREFIX}1g.0.x", f"{PREFIX}1f..x", f"{PREFIX}1f.0..",
                 "last.ckpt", f"x{PREFIX}1f.0.y"):
        assert carried_name(bare) is None, bare
    assert carried_name(private_name("step_3.pt")) == "step_3.pt"
    long = "s" * 230 + ".pt"  # with the prefix past a name's 255 bytes: the private name carries none
    assert carried_name(private_name(long)) is None and len(private_name(long)) <= 255


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_a_checkpoint_left_aside_is_put_back_or_finished(tmp_path, dry):
    run = tmp_path / "ckpt" / "run"
    for step in (1, 2):
        _file(run / f"step_{step}.pt", OLD + step)
    # A save of step 3 renamed aside by a crashed run: the newest checkpoint, its name free.
    _file(run / f"{PREFIX}1f.0.step_3.pt", OLD + 3)
    # last.pt saved again since: the one left aside is an older version of it.
    _file(run / f"{PREFIX}1f.1.last.pt", OLD)
    _file(run / "last.pt", time.time() - 3600)
    _file(run / f"{PREFIX}1f.2", OLD)  # carries no name: cannot be put back
    report = _run({"name": "ckpt", "type": "checkpoints", "roots": [str(tmp_path / "ckpt")], "keep_last": 2,
                   "patterns": ["*.pt"], "grace": "0s"}, dry_run=dry)
    if dry:
        assert sorted(os.listdir(run))[:3] == [f"{PREFIX}1f.0.step_3.pt", f"{PREFIX}1f.1.last.pt", f"{PREFIX}1f.2"]
        return
    # kept: step_3, put back in this run and so not judged in it (with grace 0s too: whether its ctime
    # reads before or after the run's start must not decide), and the newest two of the rest by time
    # (last.pt, step_2): the put-back file does not count among the kept.
    assert sorted(os.listdir(run)) == ["last.pt", "step_2.pt", "step_3.pt"], report
    assert (run / "step_3.pt").stat().st_mtime == OLD + 3


def test_a_cache_unit_left_aside_is_put_back_or_judged_whole(tmp_path):
    hub = tmp_path / "hub"
    _file(hub / f"{PREFIX}1f.0.fresh_model" / "weights.bin", time.time() - 60)  # in use a minute ago
    _file(hub / f"{PREFIX}1f.1" / "weights.bin", OLD)  # an old unit, its name unknown
    _file(hub / f"{PREFIX}1f.2.old_model" / "weights.bin", OLD)
    _file(hub / "old_model" / "weights.bin", time.time() - 60)  # downloaded again since
    for unit in (f"{PREFIX}1f.1", f"{PREFIX}1f.2.old_model"):
        os.utime(hub / unit, (OLD, OLD))
    report = _run({"name": "torch", "type": "torch-cache", "roots": [str(hub)], "older_than": "7d", "grace": "0s"})
    assert sorted(os.listdir(hub)) == ["fresh_model", "old_model"], report
    assert (hub / "old_model" / "weights.bin").stat().st_mtime > OLD + 86400  # the new download stays
    assert _private(tmp_path) == []


def test_a_set_aside_entry_carries_its_name_until_it_is_settled(tmp_path):
    """The crash point itself: after the set-aside's rename and check, before the delete."""
    from trainguard.actions.cleanup.engine.quarantine import Quarantine

    judged = _file(tmp_path / "last.ckpt", OLD)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        q = Quarantine(fd, atime=False, named=True)
        q.unlink("last.ckpt", os.lstat(judged))
        assert os.listdir(tmp_path) == [q.private] and carried_name(q.private) == "last.ckpt"
    finally:
        os.close(fd)


def test_a_hub_revision_and_blob_left_aside_are_put_back(tmp_path):
    """The revision main names and a blob it uses, under private names: put back, the links resolve again;
    the detached old revision still goes."""
    from tests.test_cleanup_hf import hf_repo

    hub = tmp_path / "hub"
    repo = hf_repo(hub, "models--org--m", recent_days=0.5, old_days=30)
    os.rename(repo / "snapshots" / "aaaa", repo / "snapshots" / f"{PREFIX}1f.0.aaaa")
    os.rename(repo / "blobs" / "w_main", repo / "blobs" / f"{PREFIX}1f.1.w_main")
    report = _run({"name": "hub", "type": "huggingface-cache", "roots": [str(hub)], "older_than": "7d",
                   "grace": "0s"})
    assert os.path.exists(repo / "snapshots" / "aaaa" / "model.safetensors"), report  # resolves to its blob
    assert not (repo / "snapshots" / "bbbb").exists() and not (repo / "blobs" / "w_old").exists()
    assert _private(tmp_path) == []
