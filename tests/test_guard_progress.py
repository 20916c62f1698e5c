"""trainguard.guard.progress(): a heartbeat from the training loop, rate-limited, never failing the step; the
daemon reads it as the process's progress."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from trainguard import guardspool
from trainguard.actions.guard_inbox import GuardInbox
from trainguard.guard import heartbeat
from trainguard.sources.runs import RunSampler

from tests.support.daemon_proc import child_env


@pytest.fixture
def state_dir(tmp_path):
    (tmp_path / "state.db").write_bytes(b"")
    heartbeat._state.update(sent=float("-inf"), count=0)  # a fresh process's heartbeat state
    return tmp_path


def spooled(state_dir) -> list[guardspool.GuardEvent]:
    return guardspool.drain(str(state_dir / guardspool.GUARD_EVENTS_FILE))[0]


def test_one_line_per_interval_whatever_the_calls(state_dir):
    for step in range(1000):
        heartbeat.progress(step, state_dir=str(state_dir))
    [event] = spooled(state_dir)
    assert (event.kind, event.step, event.source) == ("progress", 0, "progress")
    heartbeat._state["sent"] -= heartbeat.EVERY  # the interval has passed
    heartbeat.progress(state_dir=str(state_dir))
    [event] = spooled(state_dir)
    assert event.step == 1001  # without a step: how many calls so far


def test_it_never_raises_and_writes_nothing_without_a_daemon(tmp_path, state_dir):
    heartbeat.progress(1, state_dir=str(tmp_path / "missing"))
    (state_dir / guardspool.GUARD_EVENTS_FILE).mkdir()  # a spool that cannot be opened for writing
    heartbeat._state["sent"] = float("-inf")
    heartbeat.progress(2, state_dir=str(state_dir))


def test_the_daemon_reads_a_heartbeat_as_the_process_progress(state_dir):
    code = textwrap.dedent(f"""
        import sys
        from trainguard.guard import progress
        progress({{step}}, state_dir={str(state_dir)!r})
        sys.stdout.write("sent\\n"); sys.stdout.flush()
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code.replace("{step}", "41")], env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "sent\n"
        inbox = GuardInbox(str(state_dir), connect=lambda: None)
        assert inbox.drain() == []  # a heartbeat is no alert
        assert inbox.steps == {child.pid: 41}
        sampler = RunSampler()
        [run] = sampler.sample(0.0, [], inbox.steps)[0]
        [rank] = run.ranks
        guardspool.append(str(state_dir / guardspool.GUARD_EVENTS_FILE),
                          guardspool.GuardEvent(ts=1.0, kind="progress", path="", pid=child.pid, step=42))
        inbox.drain()
        [again] = sampler.sample(1.0, [], inbox.steps)[0]
        assert rank.pid == child.pid and again.ranks[0].mark == rank.mark + 1
    finally:
        child.kill()
        child.wait()
