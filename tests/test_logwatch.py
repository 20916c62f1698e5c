"""Training-log tailing on real files: rotation, copytruncate, partial lines, new files, a fast 100 MB log."""

from __future__ import annotations

import os
import time

import pytest
from trainguard.alerts.lifecycle import Lifecycle
from trainguard.config import LogWatch
from trainguard.detectors.gpu import detect_log_matches
from trainguard.records import AlertStatus, Snapshot
from trainguard.sources.logwatch import FileTail, LogWatcher


def lines(blocks):
    return [ln for b in blocks for ln in b.decode().splitlines()]


def append(path, text):
    with open(path, "a") as fh:
        fh.write(text)


def test_starts_at_the_end_and_keeps_partial_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("old line\n")
    tail = FileTail(str(log))
    assert tail.poll() == []
    append(log, "epoch 1\nTraceback (most")
    assert lines(tail.poll()) == ["epoch 1"]
    append(log, " recent call last):\n")
    assert lines(tail.poll()) == ["Traceback (most recent call last):"]


def test_follows_rename_rotation_without_losing_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    tail = FileTail(str(log))
    append(log, "a\nb\n")
    assert lines(tail.poll()) == ["a", "b"]
    append(log, "c\nlast-unterminated")
    os.rename(log, tmp_path / "train.log.1")  # logrotate's default: rename, then create
    # The trainer still holds the renamed file until it reopens: keep reading it.
    assert lines(tail.poll()) == ["c"]
    append(tmp_path / "train.log.1", " line\n")
    assert lines(tail.poll()) == ["last-unterminated line"]
    log.write_text("new 1\n")
    assert lines(tail.poll()) == ["new 1"]
    append(log, "new 2\n")
    assert lines(tail.poll()) == ["new 2"]


def test_follows_copytruncate(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    tail = FileTail(str(log))
    append(log, "before rotation, a long enough line\n")
    assert len(lines(tail.poll())) == 1
    with open(log, "r+") as fh:  # copytruncate: copy elsewhere, then truncate in place
        fh.truncate(0)
    append(log, "after\n")
    assert lines(tail.poll()) == ["after"]


def test_watcher_reads_new_files_matching_the_glob_from_their_start(tmp_path):
    spec = LogWatch(paths=[str(tmp_path / "run*" / "*.log")])
    watcher = LogWatcher([spec], use_watchdog=False)
    run = tmp_path / "run2"
    run.mkdir()
    (run / "train.log").write_text("ok\nOSError: [Errno 28] No space left on device\n")
    assert watcher.poll() == 1
    (m,) = watcher.recent()
    assert m.path == str(run / "train.log") and m.pattern == "No space left on device"
    (finding,) = detect_log_matches([spec], Snapshot(ts=time.time(), log_matches=watcher.recent()))
    assert finding.key == f"log.match:{run / 'train.log'}#No space left on device"
    assert "No space left" in finding.summary


def test_matches_expire_after_hold(tmp_path):
    now = [1000.0]
    log = tmp_path / "t.log"
    log.write_text("")
    watcher = LogWatcher([LogWatch(paths=[str(log)], hold="10m")], clock=lambda: now[0], use_watchdog=False)
    append(log, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    watcher.poll()
    assert len(watcher.recent()) == 1
    now[0] += 601
    assert watcher.recent() == ()


def test_inotify_wakes_the_watcher_promptly(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    watcher = LogWatcher([LogWatch(paths=[str(log)])], poll_interval=30).start()
    try:
        assert watcher.observed == {str(tmp_path): "inotify"}
        time.sleep(0.2)  # let the observer settle on the directory before writing
        append(log, "NCCL WARN Watchdog caught collective operation timeout: Timeout(ms)=1800000\n")
        deadline = time.monotonic() + 10
        while not watcher.recent() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m.pattern for m in watcher.recent()] == ["NCCL.*[Tt]imeout"]
    finally:
        watcher.stop()


def test_fuse_directories_are_polled_not_inotified(slowfs):
    runs = slowfs.mountpoint / "runs"
    runs.mkdir()
    (runs / "train.log").write_text("")
    watcher = LogWatcher([LogWatch(paths=[str(runs / "*.log")])], poll_interval=0.2).start()
    try:
        assert watcher.observed == {str(runs): "polling"}
        append(runs / "train.log", "FileNotFoundError: [Errno 2] No such file or directory: 'runs/x/events.out.tfevents.1'\n")
        deadline = time.monotonic() + 10
        while not watcher.recent() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m.pattern for m in watcher.recent()] == ["FileNotFoundError.*tfevents"]
    finally:
        watcher.stop()


@pytest.mark.slow
def test_100_mb_log_appended_fast_finds_every_match(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    watcher = LogWatcher([LogWatch(paths=[str(log)])], use_watchdog=False)
    filler = b"step 123456 loss 0.123456 lr 0.000100 throughput 1234.5 samples/s grad_norm 0.98765\n" * 1000
    planted = 0
    found = 0
    with open(log, "ab") as fh:
        while fh.tell() < 100 * 2**20:
            fh.write(filler)
            fh.write(b"RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
            planted += 1
            fh.write(filler[:37])  # leave a partial line across the poll boundary
            fh.flush()
            if planted % 50 == 0:
                found += watcher.poll()
            fh.write(filler[37:100])
    found += watcher.poll()
    assert found == planted


def test_matcher_with_and_without_literal_prefixes_reports_each_line_once_in_order():
    from trainguard.sources.logwatch import Matcher, literal_prefix
    assert literal_prefix("NCCL.*[Tt]imeout") == "NCCL"
    assert literal_prefix("errors?: x") == "error"
    assert literal_prefix("(?i)nccl") == ""
    m = Matcher(["(?i)nccl.*timeout", "Traceback", "CUDA out of memory"])
    block = (b"fine\nTraceback (most recent call last):\nnccl watchdog TIMEOUT\n"
             b"CUDA out of memory in Traceback\n")
    assert m.lines(block) == [("Traceback (most recent call last):", "Traceback"),
                              ("nccl watchdog TIMEOUT", "(?i)nccl.*timeout"),
                              ("CUDA out of memory in Traceback", "Traceback")]


def test_a_second_pattern_in_the_same_file_alerts_while_the_first_is_firing(tmp_path):
    """ENOSPC while an OOM from the same train.log is held is a new fact: its own alert, not a silent update."""
    now = [1000.0]
    log = tmp_path / "train.log"
    log.write_text("")
    spec = LogWatch(paths=[str(log)])
    watcher = LogWatcher([spec], clock=lambda: now[0], use_watchdog=False)
    lifecycle = Lifecycle(None, repeat_interval=4 * 3600.0, keep_firing_for=0.0)

    def cycle():
        watcher.poll()
        findings = detect_log_matches([spec], Snapshot(ts=now[0], log_matches=watcher.recent()))
        return [(e.status, e.finding.details["pattern"]) for e in lifecycle.update(findings, now[0])]

    append(log, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    assert cycle() == [(AlertStatus.FIRING, "CUDA out of memory")]
    now[0] += 60
    append(log, "OSError: [Errno 28] No space left on device\n")
    assert cycle() == [(AlertStatus.FIRING, "No space left on device")]
    assert len(lifecycle.firing()) == 2


def test_a_flood_of_one_pattern_does_not_push_out_another(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    watcher = LogWatcher([LogWatch(paths=[str(log)])], use_watchdog=False)
    append(log, "OSError: [Errno 28] No space left on device\n"
           + "RuntimeError: CUDA out of memory\n" * 1000)
    watcher.poll()
    assert {m.pattern for m in watcher.recent()} == {"No space left on device", "CUDA out of memory"}
