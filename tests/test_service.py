"""The daemon under a service manager: sd_notify on a real socket, SIGHUP, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from trainguard.service.sdnotify import SdNotifier

from tests.support.daemon_proc import DaemonProcess, child_env


class NotifySocket:
    """The receiving end systemd would hold: an AF_UNIX datagram socket."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages: list[dict[str, str]] = []

    def next(self, timeout: float = 10.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        message = dict(line.split("=", 1) for line in data.split("\n") if line)
        self.messages.append(message)
        return message

    def until(self, key: str, timeout: float = 10.0) -> dict[str, str]:
        """Read messages until one carries `key`; return it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {key} within {timeout}s; got {self.messages}")
            message = self.next(left)
            if key in message:
                return message

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    path = f"/tmp/tg-notify-{os.getpid()}-{time.monotonic_ns()}.sock"  # short: sun_path is 108 bytes
    ns = NotifySocket(path)
    try:
        yield ns
    finally:
        ns.close()
        os.unlink(path)


def test_sd_notifier_sends_datagrams_to_a_path_and_to_an_abstract_socket(notify_socket):
    notifier = SdNotifier({"NOTIFY_SOCKET": notify_socket.path})
    assert notifier.ready("2 mounts, 0 GPUs, 0 firing")
    assert notify_socket.next(2) == {"READY": "1", "STATUS": "2 mounts, 0 GPUs, 0 firing"}
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"tg-test-{os.getpid()}-{time.monotonic_ns()}"
    abstract.bind("\0" + name)
    try:
        abstract.settimeout(2)
        assert SdNotifier({"NOTIFY_SOCKET": "@" + name}).watchdog("ok")
        assert abstract.recv(4096) == b"WATCHDOG=1\nSTATUS=ok"
    finally:
        abstract.close()


def test_sd_notifier_without_systemd_is_silent_and_reads_the_watchdog_period():
    assert not SdNotifier({}).ready("x")
    assert SdNotifier({"WATCHDOG_USEC": "60000000"}).watchdog_s == 60.0
    assert SdNotifier({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 60.0
    assert SdNotifier({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}).watchdog_s is None  # meant for another process


def test_sd_notifier_survives_a_vanished_socket(tmp_path):
    notifier = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier.ready("x") is False  # logged once, never raised into the loop
    assert notifier.watchdog("x") is False


def config(state_dir, watched, *, interval="0.3s", extra: str = "") -> str:
    # Thresholds at 0 %: the mount holding `watched` is critical at once, so an alert is firing.
    return f"""
[general]
state_dir = "{state_dir}"
interval = "{interval}"
[filesystems]
paths = ["{watched}"]
exclude = ["*"]
warning = "0%"
critical = "0%"
[alerts]
keep_firing_for = "1h"
[metrics]
listen = "127.0.0.1:0"
{extra}"""


def test_service_lifecycle_ready_watchdog_bad_reload_and_clean_stop(tmp_path, notify_socket):
    state_dir = tmp_path / "state"
    watched = tmp_path / "data"
    watched.mkdir()
    env = {"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "30000000"}
    with DaemonProcess(tmp_path, config(state_dir, watched), env=env) as daemon:
        first = notify_socket.next()
        assert first["READY"] == "1"  # READY comes first, after a completed cycle
        assert first["STATUS"] == "1 mount, 0 GPUs, 1 firing"
        assert notify_socket.until("WATCHDOG")["STATUS"] == "1 mount, 0 GPUs, 1 firing"

        # SIGHUP with a broken config: the error is logged, the old config keeps running.
        daemon.config_path.write_text(config(state_dir, watched) + '[io]\nutil_threshold = "lots"\n[bogus]\n')
        daemon.signal(signal.SIGHUP)
        assert "RELOADING" in notify_socket.until("RELOADING")
        assert notify_socket.until("READY")["STATUS"].endswith("firing")
        daemon.wait_log(r"reload rejected, keeping the running config: .*io\.util_threshold")
        daemon.wait_log(r"reload rejected, keeping the running config: .*bogus: unknown key")
        notify_socket.until("WATCHDOG")  # still cycling after the bad reload
        assert daemon.proc.poll() is None

        started = time.monotonic()
        assert daemon.stop(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert "STOPPING" in notify_socket.until("STOPPING")

    conn = sqlite3.connect(state_dir / "state.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        firing = conn.execute("SELECT key, state FROM alerts").fetchall()
        assert (f"fs.usage:{next(iter(_mount_of(watched)))}", "firing") in firing
        assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] > 0
    finally:
        conn.close()


def _mount_of(path):
    from trainguard.sources.mounts import containing_mount, read_mounts
    return [containing_mount(str(path), read_mounts()).mount_point]


def test_good_reload_applies_and_health_follows_the_heartbeat(tmp_path, notify_socket):
    state_dir = tmp_path / "state"
    watched = tmp_path / "data"
    watched.mkdir()
    cmd = [sys.executable, "-m", "trainguard", "health", "--max-age", "5"]
    with DaemonProcess(tmp_path, config(state_dir, watched), env={"NOTIFY_SOCKET": notify_socket.path}) as daemon:
        notify_socket.until("READY")
        health = subprocess.run(cmd + ["-c", str(daemon.config_path)], capture_output=True, text=True,
                                env=child_env(), timeout=30)
        assert health.returncode == 0, health.stderr
        assert "1 mount, 0 GPUs, 1 firing" in health.stdout
        # A valid new config (thresholds back to normal) is applied: the alert is no longer critical.
        daemon.config_path.write_text(config(state_dir, watched).replace('"0%"', '"100%"'))
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("configuration reloaded")
        assert daemon.stop() == 0
    # Stopped: health fails at once, naming the daemon that stopped (the lock is free), however fresh its stamp.
    stopped = subprocess.run(cmd + ["-c", str(daemon.config_path)], capture_output=True, text=True,
                             env=child_env(), timeout=30)
    assert stopped.returncode == 1
    assert f"no daemon running on {state_dir}: PID {daemon.proc.pid} stopped" in stopped.stderr


def test_health_before_any_cycle_is_unhealthy(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[general]\nstate_dir = "{tmp_path / "state"}"\n')
    done = subprocess.run([sys.executable, "-m", "trainguard", "health", "--state-dir", str(tmp_path / "state"),
                           "-c", str(cfg)], capture_output=True, text=True, env=child_env(), timeout=30)
    assert done.returncode == 1
    assert "has not completed a cycle" in done.stderr
