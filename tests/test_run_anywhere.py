"""Running without systemd: one daemon per state directory (a real lock), clean signals, a log file,
and `status` / `health` that tell a running daemon from one that stopped or a one-shot run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.support.daemon_proc import DaemonProcess, child_env, wait_until
from tests.test_service import (
    config,  # thresholds at 0 %: an alert fires on the first cycle
)


def tg(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def setup(tmp_path):
    state_dir, watched = tmp_path / "state", tmp_path / "data"
    watched.mkdir()
    return state_dir, watched


def test_a_second_daemon_on_the_same_state_dir_exits_2_naming_the_pid_and_readers_keep_working(tmp_path, setup):
    state_dir, watched = setup
    with DaemonProcess(tmp_path, config(state_dir, watched)) as daemon:
        daemon.wait_log(r"started: .*pid \d+")
        cfg = str(daemon.config_path)
        assert (state_dir / "trainguard.pid").read_text().strip() == str(daemon.proc.pid)
        for argv in (["run"], ["run", "--once"]):
            second = tg(*argv, "-c", cfg, timeout=30)
            assert second.returncode == 2, second.stderr
            assert second.stderr.splitlines() == [
                f"trainguard: PID {daemon.proc.pid} already runs trainguard on this state directory "
                f"(lock {state_dir / 'trainguard.pid'}); stop it first, or give this one its own --state-dir"]
        wait_until(lambda: tg("health", "-c", cfg).returncode == 0, 15, what="the daemon's first heartbeat")
        for argv in (["status"], ["status", "--json"], ["check-config", cfg], ["cleanup", "--dry-run"]):
            done = tg(*argv, "-c", cfg)
            assert done.returncode == 0, (argv, done.stderr)
        doc = json.loads(tg("status", "--json", "-c", cfg).stdout)
        assert doc["daemon"]["running"] is True and doc["daemon"]["pid"] == daemon.proc.pid
        assert doc["daemon"]["last_cycle_age_seconds"] < 10
        table = tg("status", "-c", cfg).stdout
        assert f"Daemon: running, PID {daemon.proc.pid}, last cycle" in table
        assert f"Alerts firing (daemon, PID {daemon.proc.pid}):" in table
        assert daemon.stop() == 0
    # Stopped: shown as stopped, its alerts as what was firing when it stopped, never as firing now.
    doc = json.loads(tg("status", "--json", "-c", cfg).stdout)
    assert doc["daemon"]["running"] is False and doc["daemon"]["pid"] == daemon.proc.pid
    table = tg("status", "-c", cfg).stdout
    assert f"Daemon: not running (PID {daemon.proc.pid} stopped; its last cycle was" in table
    assert "Alerts firing (daemon" not in table
    assert "Alerts that were firing when the daemon stopped (its last cycle: 20" in table
    health = tg("health", "-c", cfg)
    assert health.returncode == 1 and f"PID {daemon.proc.pid} stopped" in health.stderr
    # The lock went with the process: a new daemon starts on the same directory.
    with DaemonProcess(tmp_path, config(state_dir, watched)) as again:
        again.wait_log(r"started: ")
        assert again.stop() == 0


def test_run_once_does_not_pass_for_a_daemon(tmp_path, setup):
    state_dir, watched = setup
    cfg = tmp_path / "c.toml"
    cfg.write_text(config(state_dir, watched))
    once = tg("run", "--once", "-c", str(cfg))
    assert once.returncode == 1, once.stderr  # critical finding at 0 %
    health = tg("health", "-c", str(cfg))
    assert health.returncode == 1
    assert "has not completed a cycle" in health.stderr
    doc = json.loads(tg("status", "--json", "-c", str(cfg)).stdout)
    assert doc["daemon"]["running"] is False and doc["daemon"]["last_cycle_at"] is None
    table = tg("status", "-c", str(cfg)).stdout
    assert "Daemon: not running (start it with: trainguard run)" in table
    assert "Alerts recorded by a one-shot run (run --once; no daemon has run here):" in table
    assert "Alerts firing (daemon" not in table


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_foreground_daemon_cleanly_with_its_state_flushed(tmp_path, setup, signum):
    state_dir, watched = setup
    log_file = tmp_path / "logs" / "trainguard.log"
    argv = [sys.executable, "-m", "trainguard", "run", "--config", str(tmp_path / "config.toml"),
            "--log-file", str(log_file)]
    with DaemonProcess(tmp_path, config(state_dir, watched), argv=argv) as daemon:
        wait_until(lambda: log_file.exists() and "started:" in log_file.read_text(), 15, what="the log file")
        wait_until(lambda: tg("health", "-c", str(daemon.config_path)).returncode == 0, 15, what="a cycle")
        daemon.signal(signum)
        assert daemon.proc.wait(10) == 0
    assert daemon.log == ""  # with --log-file nothing goes to stdout/stderr
    text = log_file.read_text()
    assert f"received {signal.Signals(signum).name}, stopping" in text and text.rstrip().endswith("stopped")
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT state FROM alerts").fetchall() == [("firing",)]
    finally:
        conn.close()
    assert not (state_dir / "state.db-wal").exists() or (state_dir / "state.db-wal").stat().st_size == 0


def test_the_log_file_rotates_by_size(tmp_path):
    import logging

    from trainguard.service.logging_setup import setup_logging

    path = tmp_path / "t.log"
    try:
        setup_logging("info", str(path), max_bytes=2000, backups=2)
        for i in range(200):
            logging.getLogger("trainguard.test").info("line %d of a daemon that runs for weeks", i)
    finally:
        for handler in logging.getLogger().handlers:
            handler.close()
        logging.basicConfig(force=True)
    assert path.stat().st_size <= 2000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.log", "t.log.1", "t.log.2"]


def test_an_unwritable_log_file_is_one_line_and_exit_2(tmp_path, setup):
    state_dir, watched = setup
    cfg = tmp_path / "c.toml"
    cfg.write_text(config(state_dir, watched))
    blocked = tmp_path / "file"
    blocked.write_text("")
    done = tg("run", "-c", str(cfg), "--log-file", str(blocked / "t.log"), timeout=30)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and f"--log-file {blocked / 't.log'}" in done.stderr


def test_the_lock_names_its_holder_and_goes_with_it(tmp_path):
    from trainguard.store.lock import LockHeld, StateLock, holder

    assert holder(str(tmp_path)).running is False and holder(str(tmp_path)).pid is None
    first = StateLock(str(tmp_path))
    first.acquire()
    assert holder(str(tmp_path)).running is True and holder(str(tmp_path)).pid == os.getpid()
    with pytest.raises(LockHeld) as held:
        StateLock(str(tmp_path)).acquire(wait=0.1)
    assert held.value.pid == os.getpid()
    first.release()
    after = holder(str(tmp_path))
    assert after.running is False and after.pid == os.getpid()  # the file still names the last daemon
    second = StateLock(str(tmp_path))
    second.acquire()
    second.release()
