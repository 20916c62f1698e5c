"""A checkpoint, cache unit or blob is deleted by name only once renamed aside and checked again: a
fixed name saved again in place (`last.ckpt`, `model.safetensors`) or a file opened between the
/proc scan and the deletion is kept. The race is made real at the last moment before the deletion
(the runner's before_delete hook): a real atomic save (write aside, rename over), a real process
opening the file. What must stay is checked on the files themselves."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_cleanup import DAY, holder, make, policy, runner
from tests.test_cleanup_attacks import UNIT_CASES, build_unit
from tests.test_cleanup_inuse import mapped_and_closed

NEW = b"saved again, in place"


def save_in_place(path: Path) -> None:
    """What torch.save / safetensors / Lightning do to a fixed name: write aside, rename over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(NEW)
    os.rename(tmp, path)


def racing(target: str, act):
    """A hook that runs act once, just before the entry whose relative path ends with target goes."""
    done = []

    def hook(event: str, relpath: str) -> None:
        if event == "before_delete" and relpath.endswith(target) and not done:
            done.append(act())

    return hook


@pytest.mark.parametrize("race", ["saved-again", "opened"])
def test_a_checkpoint_file_saved_again_or_opened_at_the_last_moment_is_kept(tmp_path, race):
    run = tmp_path / "ckpt" / "run"
    last = make(run / "last.ckpt", 4096, age=3 * DAY)
    make(run / "best.ckpt", 4096, age=DAY)
    stack = contextlib.ExitStack()
    act = (lambda: save_in_place(last)) if race == "saved-again" else (lambda: stack.enter_context(holder(last, "open")))
    with stack:
        report = runner(tmp_path, DAY, hook=racing("last.ckpt", act)).run(
            policy(type="checkpoints", roots=[str(tmp_path / "ckpt")], keep_last=1, grace="0s"))
        assert last.exists(), report
        assert report.files == 0
        if race == "saved-again":
            assert last.read_bytes() == NEW  # the new save, not a put-back old one
            assert report.skipped.get("changed") == 1, report.skipped
        else:
            assert report.skipped.get("open") == 1, report.skipped
    assert not [p for p in run.iterdir() if p.name.startswith(".trainguard-deleting.")]


@pytest.mark.parametrize("race", ["saved-again", "opened", "mapped-and-closed"])
@pytest.mark.parametrize("case", ["checkpoint-unit", "hf-repo", "torch-entry", "conda-entry"])
def test_a_unit_whose_file_is_saved_again_or_opened_at_the_last_moment_is_kept_whole(tmp_path, case, race):
    kw, unit, _sibling, newest = UNIT_CASES[case]
    root = tmp_path / "root"
    build_unit(root, unit)
    if newest:
        make(root / newest / "model.safetensors", age=DAY)
    model = root / unit / "model.safetensors"
    stack = contextlib.ExitStack()
    acts = {"saved-again": lambda: save_in_place(model), "opened": lambda: stack.enter_context(holder(model, "open")),
            "mapped-and-closed": lambda: stack.enter_context(mapped_and_closed(model))}  # safetensors' way
    with stack:
        report = runner(tmp_path, DAY, hook=racing(unit.rpartition("/")[2], acts[race])).run(
            policy(roots=[str(root)], **kw))
        assert model.exists() and (root / unit / "sub" / "shard.bin").exists(), report
        assert report.files == 0, report
        if race == "saved-again":
            assert model.read_bytes() == NEW
    assert not [p for p in (root / unit).parent.iterdir() if p.name.startswith(".trainguard-deleting.")]


def test_without_a_race_the_unit_and_the_file_still_go(tmp_path):
    run = tmp_path / "ckpt" / "run"
    last = make(run / "last.ckpt", 4096, age=3 * DAY)
    make(run / "best.ckpt", 4096, age=DAY)
    build_unit(tmp_path / "ckpt", "run/checkpoint-100")
    then = os.stat(last).st_mtime
    os.utime(run / "checkpoint-100", (then, then))
    report = runner(tmp_path, DAY).run(policy(type="checkpoints", roots=[str(tmp_path / "ckpt")], keep_last=1,
                                              grace="0s"))
    assert not last.exists() and not (run / "checkpoint-100").exists(), report
    assert sorted(p.name for p in run.iterdir()) == ["best.ckpt"]


def test_a_unit_whose_removal_fails_halfway_is_back_under_its_own_name(tmp_path):
    """A file inside the unit cannot be unlinked (immutable): what is left goes back where it was found."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr to make a file immutable")
    run = tmp_path / "ckpt" / "run"
    build_unit(tmp_path / "ckpt", "run/checkpoint-100")
    make(run / "checkpoint-200" / "model.safetensors", age=DAY)
    stuck = run / "checkpoint-100" / "sub" / "shard.bin"
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode:
        pytest.skip("this filesystem has no immutable flag")
    try:
        report = runner(tmp_path, DAY).run(policy(type="checkpoints", roots=[str(tmp_path / "ckpt")], keep_last=1,
                                                  grace="0s"))
        assert stuck.exists(), report
        assert sorted(p.name for p in run.iterdir()) == ["checkpoint-100", "checkpoint-200"]
        assert report.files == 0 and report.skipped, report
    finally:
        for path in run.rglob("shard.bin"):  # wherever it ended up
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
