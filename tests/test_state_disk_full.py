"""The state database on the disk that fills: the daemon keeps detecting, still delivers the disk-full alert
(from memory), says that its own state cannot be written, and recovers when space returns.

Real parts: a small tmpfs holding the state directory, filled by the test; the real daemon as a child
process; a real HTTP receiver for the alerts."""

from __future__ import annotations

import os
import sqlite3

import pytest

from tests.support.daemon_proc import DaemonProcess, wait_until
from tests.support.mounts import fill


def config(mnt, port) -> str:
    return f"""
[general]
hostname = "gpu-07"
state_dir = "{mnt}/state"
interval = "0.3s"
[gpu]
enabled = false
[forecast]
enabled = false
[filesystems]
exclude = ["*"]
paths = ["{mnt}"]
warning = "90%"
critical = "95%"
[alerts]
keep_firing_for = "0s"
[notify]
group_interval = "0.2s"
retry_initial = "0.5s"
retry_max = "1s"
[[notify.targets]]
name = "hook"
url = "json://127.0.0.1:{port}/alerts"
"""


def alerts(receiver) -> list[tuple[str, str]]:
    return [(a["key"].split(":", 1)[0], a["status"]) for r in receiver.requests for a in r.json()["alerts"]]


@pytest.mark.parametrize("tmpfs_mount", [8 * 2**20], indirect=True)
def test_a_full_state_disk_still_alerts_and_recovers(tmp_path, tmpfs_mount, http_receiver):
    mnt = tmpfs_mount
    ballast = mnt / "ballast.bin"
    with DaemonProcess(tmp_path, config(mnt, http_receiver.port)) as daemon:
        daemon.wait_log(r"started: ")
        wait_until(lambda: (mnt / "state" / "state.db").exists(), 10, what="the state db")
        wait_until(lambda: "cannot write" not in daemon.log and daemon.log.count("\n") > 2, 3, what="cycles")
        fill(ballast, 64 * 2**20)  # to ENOSPC: the tmpfs, and with it the state db, is full

        def fired():
            return {("fs.usage", "firing"), ("state.unwritable", "firing")} <= set(alerts(http_receiver))
        wait_until(fired, 30, what=f"both alerts at the receiver; got {alerts(http_receiver)}\n{daemon.log}")
        assert "cannot write the state database" in daemon.log
        full = next(a for r in http_receiver.requests for a in r.json()["alerts"]
                    if a["key"].startswith("state.unwritable:"))
        assert full["key"] == f"state.unwritable:{mnt}/state"
        assert "full" in full["summary"] and full["details"]["state_dir"] == f"{mnt}/state"
        assert daemon.proc.poll() is None  # still cycling

        os.unlink(ballast)  # space returns

        def resolved():
            got = set(alerts(http_receiver))
            return {("fs.usage", "resolved"), ("state.unwritable", "resolved")} <= got
        wait_until(resolved, 30, what=f"both alerts resolved; got {alerts(http_receiver)}\n{daemon.log}")
        daemon.wait_log("can be written again")
        # What was kept in memory is in the database again: all four messages, recorded delivered.
        daemon.wait_log("the alerts kept in memory are in the state database again")
        wait_until(lambda: _outbox_states(mnt) == ["delivered"] * 4, 15,
                   what=f"every alert recorded delivered in the state db: {_outbox_states(mnt)}")
        assert daemon.stop() == 0
    sent = alerts(http_receiver)
    assert sent.count(("fs.usage", "firing")) == 1 and sent.count(("state.unwritable", "firing")) == 1
    conn = sqlite3.connect(mnt / "state" / "state.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        keys = {k.split(":", 1)[0] for (k,) in conn.execute("SELECT json_extract(finding, '$.key') FROM outbox")}
        assert {"fs.usage", "state.unwritable"} <= keys
    finally:
        conn.close()


def _outbox_states(mnt) -> list[str]:
    try:
        conn = sqlite3.connect(f"file:{mnt}/state/state.db?mode=ro", uri=True, timeout=5)
        try:
            return [s for (s,) in conn.execute("SELECT state FROM outbox")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


@pytest.mark.parametrize("tmpfs_mount", [2 * 2**20], indirect=True)
def test_an_alert_delivered_while_its_outcome_cannot_be_written_is_not_sent_again(tmpfs_mount, http_receiver):
    """A row queued before the disk filled is delivered; marking it delivered fails (full disk); the next
    steps must not send it again, and the outcome is written once space returns."""
    from trainguard import config as configmod
    from trainguard.notify.worker import OutboxNotifier
    from trainguard.records import AlertEvent, AlertStatus, Finding, Severity
    from trainguard.store.state import StateDb
    from trainguard.store.writes import WriteHealth

    from tests.test_notify_delivery import FakeClock

    clock = FakeClock()
    db = StateDb(str(tmpfs_mount / "state"), check=None)
    os.makedirs(db.state_dir)
    writes = WriteHealth(db.path, clock.time)
    notify = configmod.parse({"notify": {"targets": [{"name": "hook", "timeout": "2s",
                                                      "url": f"json://127.0.0.1:{http_receiver.port}/h"}]}},
                             "test").notify
    notifier = OutboxNotifier(db, notify, "gpu-07", clock=clock, start=False, writes=writes)
    worker = notifier.workers["hook"]
    # The WAL is emptied (truncated), so marking the row delivered needs new space on the full disk.
    f = Finding("fs.usage:/data", Severity.CRITICAL, "/data 99% full", details={"pad": "x" * 3000})
    notifier.notify([AlertEvent(AlertStatus.FIRING, f, started_at=clock.now, ts=clock.now)])
    conn = sqlite3.connect(db.path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    fill(tmpfs_mount / "ballast", 64 * 2**20)
    worker.step()
    assert len(http_receiver.requests) == 1
    if writes.problem() is None:
        pytest.skip("SQLite found room for the update on the full tmpfs; nothing to hold back")
    assert "deliveries" in writes.problem().parts
    clock.advance_to(clock.now + 3600)
    worker.step()
    worker.step()
    assert len(http_receiver.requests) == 1  # held back: delivered once, never again
    os.unlink(tmpfs_mount / "ballast")
    worker.step()
    assert writes.problem() is None
    conn = sqlite3.connect(db.path)
    try:
        assert conn.execute("SELECT state FROM outbox").fetchall() == [("delivered",)]
    finally:
        conn.close()
    assert len(http_receiver.requests) == 1


@pytest.mark.parametrize("tmpfs_mount", [2 * 2**20], indirect=True)
def test_starting_on_a_full_state_disk_says_so_and_never_moves_the_database_aside(tmp_path, tmpfs_mount):
    from tests.support.cli import trainguard

    cfg = tmp_path / "c.toml"
    cfg.write_text('[gpu]\nenabled = false\n[filesystems]\nexclude = ["*"]\n')
    state = tmpfs_mount / "state"
    assert trainguard("run", "--once", "-c", str(cfg), "--state-dir", str(state)).returncode == 0
    fill(tmpfs_mount / "ballast", 64 * 2**20)
    done = trainguard("run", "--once", "-c", str(cfg), "--state-dir", str(state))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(f"trainguard: cannot open the state database in {state}: ")
    assert "Traceback" not in done.stderr
    assert not [p for p in os.listdir(state) if ".corrupt-" in p]
    os.unlink(tmpfs_mount / "ballast")
    assert trainguard("run", "--once", "-c", str(cfg), "--state-dir", str(state)).returncode == 0
    conn = sqlite3.connect(state / "state.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
