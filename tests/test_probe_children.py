"""No command leaves a `stat -f` probe child behind on a hung mount (a child left behind keeps a container's
PID namespace from ending). Real parts: the FUSE slowfs, hung; the real command as a child process in its own
session, so anything it leaves behind is found by session id after it exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import cli_env
from tests.support.daemon_proc import wait_until


def config(tmp_path, mountpoint) -> str:
    path = tmp_path / "trainguard.toml"
    path.write_text(f"""
[general]
state_dir = "{tmp_path / 'state'}"
[gpu]
enabled = false
[filesystems]
exclude = ["*"]
paths = ["{mountpoint}"]
probe_timeout = "1s"
""")
    return str(path)


def session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, cmdline) of every process in session sid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) == sid:  # after "pid (comm)": state ppid pgrp session
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    found.append((int(entry), fh.read().replace(b"\0", b" ").decode(errors="replace")))
        except (OSError, IndexError, ValueError):
            continue
    return found


def run_in_session(*args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess, list[tuple[int, str]]]:
    proc = subprocess.Popen([sys.executable, "-m", "trainguard", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                            start_new_session=True)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), session_members(proc.pid)


@pytest.mark.parametrize("argv", [["status", "--json"], ["run", "--once"]])
def test_a_command_on_a_mount_whose_server_is_stopped_leaves_no_child(tmp_path, slowfs, argv):
    """A stopped (or saturated) FUSE server has not taken the probe's request: SIGKILL ends the probe."""
    cfg = config(tmp_path, slowfs.mountpoint)
    os.kill(slowfs.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done, left = run_in_session(*argv, "-c", cfg)
        took = time.monotonic() - started
        assert "unresponsive" in done.stdout, done.stdout + done.stderr
        assert left == [], f"left behind after exit: {left}"
        assert took < 10
    finally:
        os.kill(slowfs.pid, signal.SIGCONT)


def test_a_probe_the_kernel_will_not_let_go_is_named_with_the_way_to_end_it(tmp_path, slowfs):
    """A FUSE request the server has taken and not answered ignores SIGKILL: say which PID, and how to end it."""
    cfg = config(tmp_path, slowfs.mountpoint)
    slowfs.block("statfs")
    try:
        done, left = run_in_session("status", "-c", cfg)
        assert done.returncode == 0, done.stderr
        match = re.search(rf"statfs probe \(PID (\d+)\) on {re.escape(str(slowfs.mountpoint))} is stuck in the "
                          r"kernel: .*/sys/fs/fuse/connections/\d+/abort", done.stderr)
        assert match, done.stderr
        assert [pid for pid, _ in left] == [int(match.group(1))]
    finally:
        slowfs.unblock("statfs")
    # Once the server answers, the child finishes: nothing of the command remains.
    wait_until(lambda: not os.path.exists(f"/proc/{match.group(1)}"), 10, what="the stuck probe to end")


def test_a_non_root_run_does_not_alert_about_a_mount_it_may_not_read(tmp_path):
    """A real permission denial: a tmpfs under a root-only directory, sampled by a child that dropped to
    nobody. No fs.error / fs.path_missing alert; one info line saying why and what to do."""
    from tests.support.mounts import root_reason

    if reason := root_reason():
        pytest.skip(reason)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    mnt = locked / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop to nobody, sample, report what the detectors make of it
            code = 1
            try:
                os.close(read)
                code = _sample_as_nobody(str(mnt), write)
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as fh:
            report = fh.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, report
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    keys, error, lines = report.split("\n", 2)
    assert error == "Permission denied (errno 13)"
    assert keys == "", f"alerted: {keys}"
    assert lines.strip().splitlines() == [
        f"cannot read the usage of {mnt} as uid 65534 (Permission denied (errno 13)): it is not watched and not "
        "alerted; run trainguard as root to watch it, or add it to filesystems.exclude to silence this line"]


def _sample_as_nobody(mnt: str, fd: int) -> int:
    import io
    import logging

    from trainguard import config as configmod
    from trainguard.clock import SystemClock
    from trainguard.detectors import DetectorInput, evaluate
    from trainguard.sources.fs import FsSampler
    from trainguard.store.history import History

    cfg = configmod.parse({"filesystems": {"exclude": ["*"], "paths": [mnt, f"{mnt}/ckpt"]},
                           "gpu": {"enabled": False}}, "test")
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    logging.getLogger("trainguard.sources.fs").addHandler(handler)
    logging.getLogger("trainguard.sources.fs").setLevel(logging.INFO)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    from trainguard.records import Snapshot

    sampler = FsSampler(clock=SystemClock(), paths=cfg.filesystems.paths, exclude=cfg.filesystems.exclude)
    for _ in range(3):  # said once, not every cycle
        samples, missing = sampler.sample()
    sampler.close()
    (sample,) = [s for s in samples if s.mount.mount_point == mnt]
    snapshot = Snapshot(ts=samples[0].ts, filesystems=tuple(samples), missing_paths=tuple(missing))
    findings = evaluate(DetectorInput(cfg, History(None), snapshot, snapshot.ts, {}))
    keys = ",".join(f.key for f in findings if mnt in f.key)
    os.write(fd, f"{keys}\n{sample.error}\n{captured.getvalue()}".encode())
    return 0
