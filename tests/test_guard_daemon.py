"""What a trainer's guard did reaches a running daemon: alerts for refused saves, audit rows for deletions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from trainguard.actions.cleanup.record.audit import read_freed
from trainguard.records import AlertStatus, Severity

from tests.support.clock import FakeClock
from tests.support.fake_daemon import FakeDisk, Recorder, daemon

MiB = 2**20
TRAINER = """
import sys
from trainguard.guard import CheckpointWontFit, save_checkpoint
where = sys.argv[1]
for step in (1, 2, 3):
    save_checkpoint(b"w" * 2 * 2**20, f"{where}/model_{step}.pt", keep_last=2, reserve=0)
try:
    save_checkpoint(b"w" * 7 * 2**20, f"{where}/model_4.pt", keep_last=2, nbytes=7 * 2**20, reserve=0)
except CheckpointWontFit as exc:
    print("refused:", exc)
"""


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [8 * MiB], indirect=True)
def test_a_trainers_refused_save_and_its_deletions_reach_the_daemon(tmp_path, tmpfs_mount):
    clock, recorder = FakeClock(), Recorder()
    d = daemon(tmp_path, clock, FakeDisk(), recorder)
    try:
        env = dict(os.environ, TRAINGUARD_STATE_DIR=d.state_dir)  # a trainer started beside the daemon
        out = subprocess.run([sys.executable, "-c", TRAINER, str(tmpfs_mount)], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        assert "refused: checkpoint" in out.stdout
        d.cycle()
        guard = [e for e in recorder.events if e.finding.key.startswith("guard.")]
        assert [(e.status, e.finding.severity) for e in guard] == [(AlertStatus.FIRING, Severity.CRITICAL)]
        finding = guard[0].finding
        assert finding.key == f"guard.wont-fit:{tmpfs_mount}/model_4.pt"
        assert finding.labels["mountpoint"] == str(tmpfs_mount) and "would not fit" in finding.summary
        freed = {f.policy: f for f in read_freed(d.heartbeat.conn, clock.time())}
        # model_1 went once model_3 was in place; the refused save deleted nothing.
        assert freed["guard"].files_total == 1 and freed["guard"].bytes_total >= 2 * MiB
        assert sorted(os.listdir(tmpfs_mount)) == ["model_2.pt", "model_3.pt"]
        recorder.events.clear()
        d.cycle()  # drained: nothing repeats
        assert not [e for e in recorder.events if e.finding.key.startswith("guard.")]
    finally:
        d.close()


def test_events_spooled_long_before_the_daemon_started_are_audited_not_alerted(tmp_path):
    import sqlite3

    from trainguard import guardspool
    from trainguard.actions.guard_inbox import GuardInbox

    clock = FakeClock()
    spool = str(tmp_path / guardspool.GUARD_EVENTS_FILE)
    old = guardspool.GuardEvent(clock.time() - 3 * 86400, "wont-fit", str(tmp_path / "m.pt"), 7, 100, 10, 0)
    new = old._replace(ts=clock.time() - 60, kind="fallback")
    for event in (old, new):
        assert guardspool.append(spool, event) is None
    conn = sqlite3.connect(":memory:")
    inbox = GuardInbox(str(tmp_path), lambda: conn, clock=clock.time)
    findings = inbox.drain()
    assert [(f.key.split(":")[0], f.severity) for f in findings] == [("guard.fallback", Severity.WARNING)]
    reasons = [r for (r,) in conn.execute("SELECT reason FROM cleanup_audit WHERE policy = 'guard' ORDER BY ts")]
    assert [r.split(" ")[0] for r in reasons] == ["wont-fit", "fallback"]  # both in the audit log
