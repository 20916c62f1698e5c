"""The `logs` cleanup policy: training logs rotated in place while a real child process keeps writing them."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard import config as configmod
from trainguard.actions.audit import AuditLog
from trainguard.actions.cleanup import CleanupRunner, findings_for
from trainguard.actions.rotate import rotate_logs

KiB, MiB = 2**10, 2**20
# Writes numbered lines to argv[1] (mode argv[2]: "a" is O_APPEND) until a line arrives on stdin, then
# prints how many it wrote and keeps the file open until stdin closes. Says "ready" after the first line.
WRITER = """
import select, sys, time
path, mode = sys.argv[1], sys.argv[2]
with open(path, mode, buffering=1) as log:
    i = 0
    while True:
        log.write(f"step {i:08d} loss=0.{i % 997:03d} " + "x" * 60 + "\\n")
        i += 1
        if i == 1:
            print("ready", flush=True)
        if i % 20 == 0:  # about 1.5 MB/s: the disk never fills, however slow the machine is
            time.sleep(0.001)
            if select.select([sys.stdin], [], [], 0)[0]:
                break
    print(i, flush=True)
    sys.stdin.readline()
    sys.stdin.readline()
"""


def policy(root: Path, **kw) -> configmod.LogsPolicy:
    data = {"name": "train-logs", "type": "logs", "roots": [str(root)], "max_size": "64KiB", "keep": 100, **kw}
    return configmod.parse({"cleanup": [data]}, "test").cleanup[0]


def start_writer(path: Path, mode: str = "a") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def halt(proc: subprocess.Popen) -> int:
    """Tell the writer to stop writing; the number of lines it wrote (its file stays open)."""
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    return int(proc.stdout.readline())


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(30)


def pieces(directory: Path, name: str) -> list[bytes]:
    """The generations, oldest first, then the live file."""
    gens = sorted(directory.glob(f"{name}.*.gz"), key=lambda p: -int(p.name.split(".")[-2]))
    return [gzip.decompress(p.read_bytes()) for p in gens] + [(directory / name).read_bytes()]


LINE = re.compile(rb"step (\d{8}) loss=0\.\d{3} x{60}\n")


def steps(data: bytes) -> list[int]:
    """Step numbers of the whole lines (a truncate can cut the last line of a copy in half)."""
    return [int(m.group(1)) for m in LINE.finditer(data)]


def all_lines(directory: Path, name: str) -> list[int]:
    """Every step number in the generations and the live file, read as one stream."""
    return steps(b"".join(pieces(directory, name)))


def rotate_while_writing(root: Path, pol, rotations: int = 5) -> tuple[list, int, subprocess.Popen]:
    proc = start_writer(root / "train.log")
    reports = []
    for _ in range(rotations):
        time.sleep(0.2)  # let the log grow past max_size between rotations
        reports.append(rotate_logs(pol))
    written = halt(proc)
    reports.append(rotate_logs(pol))  # once more after the last line, with the file still open
    return reports, written, proc


@pytest.mark.root
@pytest.mark.parametrize("ext4_mount", [64 * MiB], indirect=True)
def test_rotation_under_a_live_writer_loses_no_line_where_the_head_can_be_cut(ext4_mount):
    root = ext4_mount / "run"
    root.mkdir()
    reports, written, proc = rotate_while_writing(root, policy(root))
    try:
        rotated = [i for r in reports for i in r.items]
        assert len(rotated) >= 5 and all("(collapse)" in i.reason for i in rotated)
        assert all_lines(root, "train.log") == list(range(written))  # every line, once, in order
        assert sum(r.bytes for r in reports) > 0
    finally:
        stop(proc)


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [64 * MiB], indirect=True)
def test_truncate_fallback_under_a_live_writer_loses_at_most_the_truncate_window(tmpfs_mount):
    root = tmpfs_mount / "run"
    root.mkdir()
    reports, written, proc = rotate_while_writing(root, policy(root))
    try:
        rotated = [i for r in reports for i in r.items]
        assert len(rotated) >= 5 and all("(truncate)" in i.reason for i in rotated)  # tmpfs cannot collapse
        seen = all_lines(root, "train.log")
        assert seen == sorted(set(seen))  # nothing twice, nothing out of order
        # Lines can go only in the truncate window, i.e. between one generation and the next: each
        # piece on its own is a gapless run. How many go depends on the scheduler (bench/log_rotate.py).
        for run in filter(None, map(steps, pieces(root, "train.log"))):
            assert run == list(range(run[0], run[0] + len(run)))
        assert written - len(seen) < written // 10
    finally:
        stop(proc)


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
    proc = start_writer(tmp_path / "train.log", mode="w")  # like `python train.py > train.log`
    try:
        assert halt(proc) >= 20
        size = (tmp_path / "train.log").stat().st_size
        report = rotate_logs(policy(tmp_path, max_size="1KiB"))
        assert report.files == 0 and report.skipped == {"writer-without-append": 1}
        assert (tmp_path / "train.log").stat().st_size == size
    finally:
        stop(proc)


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


def test_symlinks_are_not_followed_and_the_root_is_checked(tmp_path):
    outside = tmp_path / "outside.log"
    outside.write_text("z" * 100 * KiB)
    root = tmp_path / "logs"
    root.mkdir()
    (root / "link.log").symlink_to(outside)
    report = rotate_logs(policy(root))
    assert report.files == 0 and report.skipped == {"symlink": 1} and outside.stat().st_size == 100 * KiB
    (tmp_path / "via-link").symlink_to(root)
    refused = rotate_logs(policy(tmp_path / "via-link"))
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
