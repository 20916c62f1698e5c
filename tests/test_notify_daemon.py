"""The real daemon and CLI with notify targets: restart after SIGKILL, test-alert, status,
check-config, and that no secret of a URL shows up in anything they print."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.support.http_receiver import HttpReceiver

REPO = Path(__file__).resolve().parent.parent
# Each secret is one piece of a URL: a password, a path token, a DingTalk token/secret.
SECRETS = ["hunter2pass", "pathTOKENxyz", "SECRETding", "tokenDING42", "ss00"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'daemon'}:{REPO}"}
    env.pop("TRAINGUARD_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def spawn_daemon(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'daemon'}:{REPO}"}
    env.pop("TRAINGUARD_CONFIG", None)
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--config", str(config)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)


def write_config(path: Path, state_dir: Path, targets: str) -> Path:
    path.write_text(f"""
[general]
hostname = "gpu-07"
state_dir = "{state_dir}"
interval = "1s"

[filesystems]
exclude = ["*"]
paths = ["{state_dir}/no-such-dir"]   # fires fs.path_missing on the first cycle

[notify]
retry_initial = "1s"
retry_max = "2s"
{targets}
""")
    return path


def outbox_rows(state_dir: Path) -> list[tuple]:
    if not (state_dir / "state.db").exists():
        return []
    conn = sqlite3.connect(f"file:{state_dir}/state.db?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT state, attempts FROM outbox ORDER BY id").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_sigkill_with_undelivered_alerts_then_restart_delivers_once(tmp_path):
    receiver = HttpReceiver()
    receiver.start()
    port = receiver.port
    receiver.stop()  # connection refused until the restart
    state = tmp_path / "state"
    config = write_config(tmp_path / "config.toml", state,
                          f'[[notify.targets]]\nname = "hook"\nurl = "json://127.0.0.1:{port}/alerts"\n')
    log = tmp_path / "daemon.log"
    first = spawn_daemon(config, log)
    try:
        wait_until(lambda: any(s == "pending" and a >= 1 for s, a in outbox_rows(state)), 30,
                   "a failed delivery attempt in the outbox")
    finally:
        stop(first, signal.SIGKILL)
    assert outbox_rows(state)[0][0] == "pending"
    receiver.start()
    second = spawn_daemon(config, log)
    try:
        (request,) = receiver.wait_for(1, timeout=30)
        wait_until(lambda: outbox_rows(state) and all(s == "delivered" for s, _ in outbox_rows(state)), 15,
                   "the outbox to mark it delivered")
        time.sleep(1.5)  # a further cycle or retry would have sent it again by now
    finally:
        stop(second)
        receiver.stop()
    assert len(receiver.requests) == 1
    doc = request.json()
    assert doc["key"].startswith("fs.path_missing:") and doc["host"] == "gpu-07" and doc["status"] == "firing"
    assert second.returncode == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_test_alert_reports_each_target_and_nothing_prints_a_secret(tmp_path):
    mail_port = _closed_port()
    with HttpReceiver() as ok_receiver, HttpReceiver(default_status=500) as bad_receiver:
        targets = f"""
[[notify.targets]]
name = "ok-hook"
url = "json://user:hunter2pass@127.0.0.1:{ok_receiver.port}/pathTOKENxyz"

[[notify.targets]]
name = "broken-hook"
url = "json://127.0.0.1:{bad_receiver.port}/pathTOKENxyz"

[[notify.targets]]
name = "mail"
url = "mailtos://ops:hunter2pass@example.com:{mail_port}?smtp=127.0.0.1&mode=insecure&from=tg@example.com&to=ops@example.com"
"""
        state = tmp_path / "state"
        config = write_config(tmp_path / "config.toml", state, targets)
        outputs = []
        result = run_cli("test-alert", "--config", str(config), "--severity", "critical")
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == 1, result.stderr
        lines = {line.split(":", 1)[0]: line for line in result.stdout.splitlines()}
        assert "delivered" in lines["ok-hook"]
        assert "FAILED" in lines["broken-hook"] and "500" in lines["broken-hook"]
        assert "FAILED" in lines["mail"] and "127.0.0.1" in lines["mail"]
        arrived = ok_receiver.wait_for(1)[0].json()
        assert arrived["severity"] == "critical" and "test alert" in arrived["title"]
        assert arrived["key"] == "trainguard.test"

        result = run_cli("test-alert", "--config", str(config), "--target", "ok-hook")
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == 0 and result.stdout.startswith("ok-hook: delivered")

        result = run_cli("check-config", str(config))
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == 0

        # The daemon fails to deliver to two targets and logs why, then status shows the outbox.
        log = tmp_path / "daemon.log"
        daemon = spawn_daemon(config, log)
        try:
            wait_until(lambda: sum(a >= 1 for s, a in outbox_rows(state)) >= 2, 30, "failed attempts")
        finally:
            stop(daemon)
        outputs.append(log.read_text())
        result = run_cli("status", "--config", str(config))
        outputs.append(result.stdout + result.stderr)
        assert "Notifications:" in result.stdout and "broken-hook" in result.stdout
        result = run_cli("status", "--config", str(config), "--json")
        outputs.append(result.stdout + result.stderr)

        box = json.loads(result.stdout)["outbox"]
        assert {r["target"] for r in box["retrying"]} == {"broken-hook", "mail"}
        assert box["delivered_24h"] == 1 and box["pending"] == 2

    # An unknown scheme and an invalid DingTalk token: named, redacted, exit 2.
    bad = write_config(tmp_path / "bad.toml", tmp_path / "state2", """
[[notify.targets]]
name = "typo"
url = "dingtlak://SECRETding@tokenDING42/"

[[notify.targets]]
name = "robot"
url = "dingtalk://SECRETding@tokenDING42-not!valid/"
""")
    result = run_cli("check-config", str(bad))
    outputs.append(result.stdout + result.stderr)
    assert result.returncode == 2
    assert "target 'typo': unknown apprise URL scheme 'dingtlak' dingtlak://***@***/" in result.stderr
    assert "target 'robot': invalid apprise URL dingtalk://***@***/" in result.stderr

    text = "\n".join(outputs)
    for secret in SECRETS[:-1]:
        assert secret not in text, f"{secret} leaked"
    assert "json://***@127.0.0.1" in text


def test_daemon_starts_and_samples_without_importing_apprise(tmp_path):
    state = tmp_path / "state"
    config = write_config(tmp_path / "c.toml", state, '[[notify.targets]]\nname = "x"\n'
                                                    'url = "json://127.0.0.1:9/x"\n')
    code = (
        "import sys; from trainguard import config; from trainguard.service.daemon import Daemon\n"
        f"d = Daemon(config.load({str(config)!r}))\n"
        "d.notifiers[-1].close(0)\n"  # no worker may run before the check
        "d.notifiers = d.notifiers[:1]\n"
        "d.cycle()\n"
        "print('apprise' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'daemon'}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
