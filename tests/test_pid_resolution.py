"""NVML's host PIDs resolved against /proc: the PID inside the process's own namespace, its name and state.

The namespace PID is read once per process (it never changes); the state is read every time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from trainguard.sources.procs import PidResolver


def _ns_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: a PID namespace needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30)
    if done.returncode != 0:
        return f"cannot make a PID namespace here: {done.stderr.decode(errors='replace').strip()}"
    return None


def _child_of(pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                children = fh.read().split()
        except OSError:
            children = []
        if children and _comm(int(children[0])) == "sleep":  # forked, and past its exec of sleep
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("unshare did not start sleep in its namespace")


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _wait_for_state(pid: int, wanted: str) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.skipif(_ns_reason() is not None, reason=str(_ns_reason()))
def test_a_process_in_its_own_pid_namespace_is_resolved_and_its_state_followed():
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "60"])
    try:
        sleeper = _child_of(outer.pid)
        resolver = PidResolver("/proc", host_view=True)
        first = resolver.resolve([sleeper])[sleeper]
        assert (first.pid, first.ns_pid, first.name, first.exists) == (sleeper, 1, "sleep", True)
        os.kill(sleeper, signal.SIGSTOP)
        _wait_for_state(sleeper, "T")
        stopped = resolver.resolve([sleeper])[sleeper]
        assert stopped.state == "T" and stopped.ns_pid == 1, "the state is read afresh, the namespace PID kept"
        os.kill(sleeper, signal.SIGKILL)
        outer.wait(timeout=10)
        gone = resolver.resolve([sleeper])[sleeper]
        assert gone.exists is False and "no longer exists" in gone.note
    finally:
        outer.kill()
        outer.wait(timeout=10)


def test_a_process_in_this_namespace_has_no_inner_pid_and_its_own_name():
    child = subprocess.Popen(["sleep", "60"])
    try:
        r = PidResolver("/proc", host_view=True).resolve([child.pid])[child.pid]
        assert (r.pid, r.ns_pid, r.name) == (child.pid, None, "sleep")
        assert r.state in ("S", "R") and r.note == ""
    finally:
        child.kill()
        child.wait(timeout=10)
