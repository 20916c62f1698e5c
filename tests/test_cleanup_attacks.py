"""Attacks on cleanup with real mounts and processes: a bind mount of an outside directory
inside every kind of unit, a read-only root, an open file on a hung share."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli import trainguard
from tests.test_cleanup import DAY, make, policy, runner


@contextlib.contextmanager
def bind(source: Path, target: Path, *options: str):
    if os.geteuid() != 0:
        pytest.skip("needs root to bind mount")
    target.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot bind mount: {res.stderr.strip()}")
    try:
        for opt in options:
            subprocess.run(["mount", "-o", f"remount,bind,{opt}", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def outside_tree(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    make(outside / "precious.dat", age=60 * DAY)
    make(outside / "deep" / "precious2.dat", age=60 * DAY)
    return outside


def survived(outside: Path) -> bool:
    return (outside / "precious.dat").exists() and (outside / "deep" / "precious2.dat").exists()


# Each case: the policy, the unit that holds the bind mount, and a sibling unit that must go.
UNIT_CASES = {
    "checkpoint-unit": (dict(type="checkpoints", keep_last=1), "run/checkpoint-100", "run/checkpoint-50",
                        "run/checkpoint-200"),
    "hf-repo": (dict(type="huggingface-cache", older_than="1d"), "models--org--a", "models--org--b", None),
    "torch-entry": (dict(type="torch-cache", older_than="1d"), "owner_repo_main", "other_repo_main", None),
    "conda-entry": (dict(type="conda-cache", older_than="1d"), "numpy-1.26.0-py311_0", "scipy-1.0-py311_0", None),
    "pip-entry": (dict(type="pip-cache", older_than="1d"), "http-v2/a/b", "http-v2/c/d", None),
}


def build_unit(root: Path, unit: str) -> None:
    make(root / unit / "model.safetensors", age=40 * DAY)
    make(root / unit / "sub" / "shard.bin", age=40 * DAY)


@pytest.mark.parametrize("case", sorted(UNIT_CASES))
def test_a_bind_mount_inside_a_unit_is_never_deleted_through(tmp_path, case):
    kw, unit, sibling, newest = UNIT_CASES[case]
    root = tmp_path / "root"
    outside = outside_tree(tmp_path)
    for u in (unit, sibling):
        build_unit(root, u)
    if newest:
        make(root / newest / "model.safetensors", age=DAY)
    with bind(outside, root / unit / "sub" / "mnt"):
        report = runner(tmp_path, DAY).run(policy(roots=[str(root)], **kw))
        assert survived(outside), f"{case}: files of the bind-mounted directory were deleted"
        assert (root / unit / "sub" / "mnt" / "precious.dat").exists()
    assert not (root / sibling).exists() or not (root / sibling / "model.safetensors").exists(), report
    if case != "pip-entry":  # pip has no units: its files go one by one around the mount point
        assert report.skipped.get("mount-point", 0) >= 1, report.skipped


@pytest.mark.parametrize("case", ["checkpoint-unit", "hf-repo", "conda-entry"])
def test_a_bind_mount_made_between_judging_and_removing_a_unit_stops_the_removal(tmp_path, case):
    kw, unit, _sibling, newest = UNIT_CASES[case]
    root = tmp_path / "root"
    outside = outside_tree(tmp_path)
    build_unit(root, unit)
    (root / unit / "sub" / "mnt").mkdir()
    if newest:
        make(root / newest / "model.safetensors", age=DAY)
    stack = contextlib.ExitStack()

    def hook(event: str, relpath: str) -> None:
        if event == "before_delete" and relpath.endswith(unit.rpartition("/")[2]):
            stack.enter_context(bind(outside, root / unit / "sub" / "mnt"))

    with stack:
        report = runner(tmp_path, DAY, hook=hook).run(policy(roots=[str(root)], **kw))
        assert survived(outside), report
        assert report.files == 0 and report.skipped.get("mount-point") == 1, report.skipped


def test_a_bind_mount_of_the_same_filesystem_is_not_entered_by_the_age_walk(tmp_path):
    root = tmp_path / "root"
    outside = outside_tree(tmp_path)
    make(root / "a" / "old.dat", age=40 * DAY)
    with bind(outside, root / "a" / "mnt"):
        runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
        assert survived(outside)
    assert not (root / "a" / "old.dat").exists()


# ------------------------------------------------------------------ hung share with an open file


@contextlib.contextmanager
def held_open(path: Path):
    """A real child process that keeps path open until the block ends."""
    code = f"f = open({str(path)!r}, 'rb')\nprint('ready', flush=True)\nimport sys; sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(10)


@contextlib.contextmanager
def hung_share_with_open_file(slowfs):
    (slowfs.mountpoint / "shared.dat").write_bytes(b"x" * 100)
    with held_open(slowfs.mountpoint / "shared.dat"):
        slowfs.block("getattr")
        try:
            yield
        finally:
            slowfs.unblock("getattr")


def test_cleanup_command_finishes_while_a_file_is_open_on_a_hung_share(tmp_path, slowfs):
    # The share is mounted below the root (tmp_path/mnt): pruned by the walk, and its open
    # file must not be stat'ed when the open-file index is built.
    make(tmp_path / "old.dat", age=40 * DAY)
    cfg = tmp_path / "config.toml"
    cfg.write_text(textwrap.dedent(f"""
        [general]
        state_dir = "{tmp_path / 'state'}"
        [[cleanup]]
        name = "scratch"
        type = "age"
        roots = ["{tmp_path}"]
        age_by = ["mtime"]
        older_than = "7d"
        grace = "0s"
        exclude = ["state", "config.toml"]
    """))
    with hung_share_with_open_file(slowfs):
        started = time.monotonic()
        done = trainguard("cleanup", "--config", str(cfg), timeout=30)
        assert time.monotonic() - started < 20
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "old.dat").exists(), done.stdout + done.stderr


def test_daemon_cleanup_finishes_while_a_file_is_open_on_a_hung_share(tmp_path, slowfs):
    root = tmp_path / "root"
    make(root / "old.dat", age=40 * DAY)
    pol = policy(type="age", roots=[str(root)], age_by=["mtime"])
    reports = []
    with hung_share_with_open_file(slowfs):
        worker = threading.Thread(target=lambda: reports.append(runner(tmp_path, DAY).run(pol)), daemon=True)
        worker.start()
        worker.join(20)
        assert not worker.is_alive(), "cleanup hung on the share"
    assert reports[0].files == 1
