"""Attacks on cleanup with real mounts and processes: a bind mount of an outside directory
inside every kind of unit, a read-only root, an open file on a hung share."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from trainguard.actions.cleanup.runner import findings_for
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import Severity

from tests.support.cli import cli_env, trainguard
from tests.test_cleanup import DAY, holder, make, policy, runner


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
def hung_share_with_open_file(slowfs):
    (slowfs.mountpoint / "shared.dat").write_bytes(b"x" * 100)
    with holder(slowfs.mountpoint / "shared.dat", "open"):
        slowfs.block("getattr")
        try:
            yield
        finally:
            slowfs.unblock("getattr")


def test_cleanup_command_finishes_while_a_file_is_open_on_a_hung_share(tmp_path, slowfs):
    # The share is mounted below the root (tmp_path/mnt): pruned by the walk, and its open
    # file must not be stat'ed when the open-file index is built.
    make(tmp_path / "old.dat", age=40 * DAY)
    cfg = write_config(tmp_path, str(tmp_path), 'older_than = "7d"\nexclude = ["state", "config.toml"]\n')
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


# ------------------------------------------------------------------ a root the daemon cannot write


@pytest.mark.parametrize("kind", ["age", "checkpoints"])
def test_a_read_only_root_is_a_warning_with_the_next_step_not_silence(tmp_path, kind):
    root = tmp_path / "root"
    make(root / "run" / "step1.pt", age=40 * DAY)
    make(root / "run" / "step2.pt", age=30 * DAY)
    kw = dict(age_by=["mtime"]) if kind == "age" else dict(keep_last=1)
    with bind(root, root, "ro"):  # what ProtectSystem=strict makes of a path not in ReadWritePaths=
        report = runner(tmp_path, DAY).run(policy(type=kind, roots=[str(root)], **kw))
        dry = runner(tmp_path, DAY).run(policy(type=kind, roots=[str(root)], **kw), dry_run=True)
    assert (root / "run" / "step1.pt").exists()
    (finding,) = [f for f in findings_for(report) if f.key == "cleanup.blocked:p"]
    assert finding.severity is Severity.WARNING and "read-only" in finding.summary and str(root) in finding.summary
    assert "ReadWritePaths=" in finding.hint
    assert finding.details["blocked_paths"] == [{"path": str(root), "why": "read-only"}]
    zh = texts_for(finding, tr("zh"))  # a Chinese reader gets the reason from the facts
    assert zh.what == f"清理策略 p 无法在其目录下删除文件：{root} 在这里是只读挂载。" and not zh.fallback
    assert dry.blocked and dry.files >= 1  # the dry run still shows what would go, and that it cannot


# ------------------------------------------------------------------ bad roots and bad names


def write_config(tmp_path: Path, root: str | bytes, extra: str = "") -> Path:
    cfg = tmp_path / "config.toml"
    text = (f'[general]\nstate_dir = "{tmp_path / "state"}"\n[[cleanup]]\nname = "scratch"\ntype = "age"\n'
            f'roots = ["{root}"]\nage_by = ["mtime"]\ngrace = "0s"\n{extra}')
    cfg.write_text(text)
    return cfg


def one_error_line(stderr: str, *words: str) -> bool:
    """The refusal is one line naming the key and the reason (after the "invalid configuration:" heading)."""
    lines = [line for line in stderr.strip().splitlines() if not line.endswith("invalid configuration:")]
    return "Traceback" not in stderr and len(lines) == 1 and all(w in lines[0] for w in words)


@pytest.mark.parametrize("target", ["/", "file"])
def test_a_root_that_is_a_symlink_is_refused_with_one_line(tmp_path, target):
    (tmp_path / "file").write_text("x")
    link = tmp_path / "link"
    link.symlink_to("/" if target == "/" else tmp_path / "file")
    cfg = write_config(tmp_path, str(link))
    for command in (["check-config"], ["cleanup", "--dry-run"]):
        done = trainguard(*command, "--config", str(cfg), timeout=30)
        assert done.returncode == 2, done.stdout + done.stderr
        assert one_error_line(done.stderr, "symlink", str(link)), done.stderr


def test_a_nul_byte_in_a_root_is_refused_with_one_line(tmp_path):
    cfg = write_config(tmp_path, str(tmp_path) + "/a\\u0000b")
    done = trainguard("check-config", "--config", str(cfg), timeout=30)
    assert done.returncode == 2 and one_error_line(done.stderr, "NUL", "cleanup"), done.stderr


def test_a_root_swapped_for_a_symlink_after_loading_is_refused_at_run_time(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    pol = policy(type="age", roots=[str(root)], age_by=["mtime"])
    root.rmdir()
    root.symlink_to("/")
    report = runner(tmp_path, DAY).run(pol)
    assert report.files == 0 and "symlink" in report.roots[0].note and "'/'" in report.roots[0].note


def test_non_utf8_names_are_printed_escaped(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    name = os.path.join(os.fsencode(root), b"old\xff\x1b.dat")
    with open(name, "wb") as fh:
        fh.write(b"x")
    os.utime(name, (time.time() - 40 * DAY,) * 2)
    cfg = write_config(tmp_path, str(root))
    env = {**cli_env(), "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    dry = trainguard("cleanup", "--dry-run", "--verbose", "--config", str(cfg), env=env, timeout=30)
    assert dry.returncode == 0 and "Traceback" not in dry.stderr, dry.stderr
    assert "old\\xff\\x1b.dat" in dry.stdout
    real = trainguard("cleanup", "--verbose", "--config", str(cfg), env=env, timeout=30)
    assert real.returncode == 0 and "old\\xff\\x1b.dat" in real.stdout, real.stderr
    assert not os.path.exists(name)
    conn = sqlite3.connect(tmp_path / "state" / "state.db")
    assert conn.execute("SELECT path FROM cleanup_audit").fetchone()[0].endswith("old\\xff\\x1b.dat")


@pytest.mark.parametrize("moved", ["the directory", "its parent"])
@pytest.mark.parametrize("compiled", [False, True], ids=["python-judge", "compiled-judge"])
def test_a_directory_renamed_out_of_the_root_during_a_run_is_not_cleaned_further(tmp_path, monkeypatch, compiled, moved):
    from trainguard.actions.cleanup.engine import agepass
    from trainguard.actions.cleanup.record.audit import AuditLog

    if compiled and not agepass.ENABLED:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", compiled)
    monkeypatch.setattr(agepass, "READ_BYTES", 1024)  # ~30 names a batch: several in one directory
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    for i in range(200):
        make(root / "job" / "run" / f"f{i:03d}.dat")
    batches = []

    def hook(event: str, relpath: str) -> None:
        if event == "batch" and relpath == "job/run":
            batches.append(relpath)
            if len(batches) == 2:  # the first batch went; the run is between two batches of job/run
                os.rename(root / "job" / "run", outside / "run") if moved == "the directory" else \
                    os.rename(root / "job", outside / "job")

    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    report = runner(tmp_path, DAY, hook=hook, audit=AuditLog(conn)).run(
        policy(roots=[str(root)], type="age", age_by=["mtime"], max_delete=False, older_than="3d"))
    now_at = outside / "run" if moved == "the directory" else outside / "job" / "run"
    left = sorted(p.name for p in now_at.iterdir())
    rows = [p for (p,) in conn.execute("SELECT path FROM cleanup_audit")]
    first_batch = 200 - len(left)
    assert 0 < first_batch < 60 and len(batches) == 2  # one batch went before the rename; none after it
    assert len(rows) == first_batch == report.files
    assert all(p.startswith(str(root / "job" / "run") + "/") for p in rows)
    assert not set(left) & {os.path.basename(p) for p in rows}  # every row is a file that really went
    assert report.skipped.get("moved") == 1


@pytest.mark.parametrize("when", ["between the count and the deletion", "between two batches of the deletion",
                                  "swapped for a directory from outside"])
@pytest.mark.parametrize("compiled", [False, True], ids=["python-judge", "compiled-judge"])
def test_a_directory_renamed_out_of_the_root_after_a_guarded_count_is_not_cleaned(tmp_path, monkeypatch, compiled,
                                                                                  when):
    """A guarded run deletes what its count remembered, reopening each directory below the root: one
    renamed away since is not followed, and one renamed away between two batches is noticed before
    the next."""
    from trainguard.actions.cleanup.engine import agepass, remembered
    from trainguard.actions.cleanup.record.audit import AuditLog

    if compiled and not agepass.ENABLED:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", compiled)
    monkeypatch.setattr(remembered, "CHUNK", 30)
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    for i in range(200):
        make(root / "job" / "run" / f"f{i:03d}.dat")
        make(outside / "precious" / f"f{i:03d}.dat")  # the same names, as old, outside the root
    opened, batches = [], []

    def hook(event: str, relpath: str) -> None:
        if relpath != "job/run":
            return
        if event == "open_dir":
            opened.append(relpath)  # the count's walk, then the deletion's reopening
        if len(opened) < 2:
            return
        if event == "open_dir" and when != "between two batches of the deletion" or \
                event == "batch" and len(batches) == 1 and when == "between two batches of the deletion":
            os.rename(root / "job" / "run", outside / "run")
            if when == "swapped for a directory from outside":
                os.rename(outside / "precious", root / "job" / "run")
        if event == "batch":
            batches.append(relpath)

    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    report = runner(tmp_path, DAY, hook=hook, audit=AuditLog(conn)).run(
        policy(roots=[str(root)], type="age", age_by=["mtime"], max_delete=1000, older_than="3d"))
    left = sorted(p.name for p in (outside / "run").iterdir())
    rows = [p for (p,) in conn.execute("SELECT path FROM cleanup_audit")]
    went = 30 if when == "between two batches of the deletion" else 0
    assert report.planned_files == 200 and not report.guard
    assert len(left) == 200 - went and len(rows) == went == report.files
    assert all(p.startswith(str(root / "job" / "run") + "/") for p in rows)
    assert not set(left) & {os.path.basename(p) for p in rows}
    assert report.skipped.get("moved", 0) + report.skipped.get("vanished", 0) == 1
    if when == "swapped for a directory from outside":
        assert len(list((root / "job" / "run").iterdir())) == 200 and report.skipped.get("moved") == 1
