"""The `logs` cleanup policy: training logs rotated in place while a real child process keeps writing them."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import time
from pathlib import Path

import pytest
from trainguard import config as configmod
from trainguard.actions.cleanup.kinds.logs import rotate_logs
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.runner import CleanupRunner, findings_for

from tests.support.log_writer import LogWriter, pieces, steps

KiB, MiB = 2**10, 2**20


def policy(root: Path, **kw) -> configmod.LogsPolicy:
    data = {"name": "train-logs", "type": "logs", "roots": [str(root)], "max_size": "64KiB", "keep": 100, **kw}
    return configmod.parse({"cleanup": [data]}, "test").cleanup[0]


def all_lines(directory: Path, name: str) -> list[int]:
    """Every step number in the generations and the live file, read as one stream."""
    return steps(b"".join(pieces(directory, name)))


@contextlib.contextmanager
def rotated_while_writing(mount: Path, method: str, rotations: int = 5):
    """Rotate a log under a live O_APPEND writer; yields (the log's directory, reports, lines written)."""
    root = mount / "run"
    root.mkdir()
    pol = policy(root)
    writer = LogWriter(root / "train.log", pace=20)  # about 1.5 MB/s: the disk never fills, however slow the machine
    try:
        reports = []
        for _ in range(rotations):
            time.sleep(0.2)  # let the log grow past max_size between rotations
            reports.append(rotate_logs(pol))
        written = writer.halt()
        reports.append(rotate_logs(pol))  # once more after the last line, with the file still open
        rotated = [i for r in reports for i in r.items]
        assert len(rotated) >= rotations and all(f"({method})" in i.reason for i in rotated)
        yield root, reports, written
    finally:
        writer.close()


@pytest.mark.root
@pytest.mark.parametrize("ext4_mount", [64 * MiB], indirect=True)
def test_rotation_under_a_live_writer_loses_no_line_where_the_head_can_be_cut(ext4_mount):
    with rotated_while_writing(ext4_mount, "collapse") as (root, reports, written):
        assert all_lines(root, "train.log") == list(range(written))  # every line, once, in order
        assert sum(r.bytes for r in reports) > 0


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [64 * MiB], indirect=True)
def test_truncate_fallback_under_a_live_writer_loses_at_most_the_truncate_window(tmpfs_mount):
    with rotated_while_writing(tmpfs_mount, "truncate") as (root, _reports, written):  # tmpfs cannot collapse
        seen = all_lines(root, "train.log")
        assert seen == sorted(set(seen))  # nothing twice, nothing out of order
        # Lines can go only in the truncate window, i.e. between one generation and the next: each
        # piece on its own is a gapless run. How many go depends on the scheduler (bench/log_rotate.py).
        for run in filter(None, map(steps, pieces(root, "train.log"))):
            assert run == list(range(run[0], run[0] + len(run)))
        assert written - len(seen) < written // 10


def test_binary_files_and_small_logs_are_never_touched(tmp_path):
    events = tmp_path / "events.out.tfevents.1700000000.host"
    events.write_bytes(b"\x18\x00\x00\x00" + os.urandom(200 * KiB))
    binary_log = tmp_path / "weird.log"
    binary_log.write_bytes(b"text\n" + b"\0" * 10 + b"x" * 200 * KiB)
    small = tmp_path / "small.log"
    small.write_text("hello\n")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (events, binary_log, small)}
    report = rotate_logs(policy(tmp_path, patterns=["*"]))
    assert report.files == 0 and report.skipped.get("binary") == 2
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in before)


def test_a_writer_without_append_is_left_alone(tmp_path):
    writer = LogWriter(tmp_path / "train.log", mode="w")  # like `python train.py > train.log`
    try:
        assert writer.halt() >= 50
        size = (tmp_path / "train.log").stat().st_size
        report = rotate_logs(policy(tmp_path, max_size="1KiB"))
        assert report.files == 0 and report.skipped == {"writer-without-append": 1}
        assert (tmp_path / "train.log").stat().st_size == size
    finally:
        writer.close()


def test_keep_n_generations_newest_first_and_bytes_saved(tmp_path):
    log = tmp_path / "train.log"
    for round_ in range(4):
        log.write_text("".join(f"round {round_} line {i} " + "y" * 50 + "\n" for i in range(3000)))
        report = rotate_logs(policy(tmp_path, keep=2))
        assert report.files == 1 and report.bytes > 100 * KiB  # compressible text: most of it saved
    assert sorted(os.listdir(tmp_path)) == ["train.log", "train.log.1.gz", "train.log.2.gz"]
    assert gzip.decompress((tmp_path / "train.log.1.gz").read_bytes()).startswith(b"round 3")
    assert gzip.decompress((tmp_path / "train.log.2.gz").read_bytes()).startswith(b"round 2")
    assert log.stat().st_size < 4096  # what is left is less than one block (all of it where collapse is missing)
    log.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(log, 65534, 65534)
    log.write_text("w" * 100 * KiB)
    rotate_logs(policy(tmp_path, keep=2))
    newest = (tmp_path / "train.log.1.gz").stat()
    assert newest.st_mode & 0o777 == 0o644  # the generation is readable as the log was, by its owner
    assert os.geteuid() != 0 or (newest.st_uid, newest.st_gid) == (65534, 65534)
    log.write_text("v" * 100 * KiB)
    assert rotate_logs(policy(tmp_path, keep=0)).files == 1  # keep = 0: emptied, no generation left
    assert os.listdir(tmp_path) == ["train.log"]


def test_symlinks_are_not_followed_and_the_root_is_checked(tmp_path):
    outside = tmp_path / "outside.log"
    outside.write_text("z" * 100 * KiB)
    root = tmp_path / "logs"
    root.mkdir()
    (root / "link.log").symlink_to(outside)
    report = rotate_logs(policy(root))
    assert report.files == 0 and report.skipped == {"symlink": 1} and outside.stat().st_size == 100 * KiB
    (tmp_path / "via-link").symlink_to(root)
    with pytest.raises(configmod.ConfigError, match="symlink"):
        policy(tmp_path / "via-link")  # refused when the config is read ...
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    checked = policy(swapped)
    swapped.rmdir()
    swapped.symlink_to(root)  # ... and when a root becomes a symlink after that
    refused = rotate_logs(checked)
    assert refused.files == 0 and "symlink" in refused.roots[0].note


@pytest.mark.root
def test_a_mount_below_the_root_is_not_entered(tmp_path, tmpfs_mount):
    from tests.support.mounts import _run

    inner = tmp_path / "inner"
    inner.mkdir()
    _run(["mount", "--bind", str(tmpfs_mount), str(inner)])
    try:
        (inner / "other.log").write_text("w" * 100 * KiB)
        assert rotate_logs(policy(tmp_path)).files == 0
        assert (inner / "other.log").stat().st_size == 100 * KiB
    finally:
        _run(["umount", str(inner)])


def test_cleanup_runner_dispatches_and_audits_a_logs_policy(tmp_path):
    import sqlite3

    root = tmp_path / "logs"
    root.mkdir()
    (root / "train.log").write_text("q" * 300 * KiB)
    pol = policy(root)
    audit = AuditLog(sqlite3.connect(":memory:"))
    report = CleanupRunner([pol], audit=audit).run(pol, trigger="schedule")
    assert report.type == "logs" and report.files == 1
    [(ts, name, path, nbytes, reason)] = audit.entries()
    assert name == "train-logs" and path == str(root / "train.log") and nbytes == report.bytes > 0
    [finding] = findings_for(report)
    assert finding.key == "cleanup.report:train-logs"
    dry = CleanupRunner([pol]).run(pol, dry_run=True)
    assert dry.files == 0  # nothing left above max_size


def test_logs_policy_config_needs_roots():
    with pytest.raises(configmod.ConfigError, match="logs needs roots"):
        configmod.parse({"cleanup": [{"name": "l", "type": "logs"}]}, "test")
