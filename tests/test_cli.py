"""The `trainguard` command as a user runs it: a real child process, its exit status and its output."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from trainguard import config as configmod

from tests.support.cli import Daemon, cli_env, trainguard

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Watch only the filesystem holding the test's tmp dir, so the host's other mounts do not add findings.
ONLY = 'exclude = ["*"]\n'


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "trainguard.toml"
    path.write_text(body)
    return path


def test_check_config_valid_prints_the_effective_config(tmp_path):
    path = write_config(tmp_path, '[filesystems]\nwarning = "80%"\n[[notify.targets]]\nname = "dt"\n'
                                  'url = "dingtalk://TOKEN123@SECRET456/"\n')
    result = trainguard("check-config", str(path))
    assert result.returncode == 0, result.stderr
    head, merged, _ = result.stdout.split("\n", 2)
    assert head == f"# valid: {path}" and merged == f"# merged: {path}"
    effective = tomllib.loads(result.stdout)
    assert effective["filesystems"]["warning"] == "80%"
    assert effective["forecast"]["window"] == "6h", "durations print as a person writes them"
    assert "TOKEN123" not in result.stdout and "SECRET456" not in result.stdout


def test_check_config_invalid_exits_2_with_one_line_per_problem(tmp_path):
    path = write_config(tmp_path, '[filesystems]\nwarning = "95%"\ncritical = "90%"\nwarnign = 1\n'
                                  '[general]\ninterval = "-5s"\n')
    result = trainguard("check-config", str(path))
    assert result.returncode == 2
    problems = [ln for ln in result.stderr.splitlines() if ln.startswith(f"{path}: ")]
    assert len(problems) == 2, result.stderr
    assert any("filesystems.warnign: unknown key" in p for p in problems)
    assert any("general.interval" in p and "'-5s'" in p for p in problems)


def test_check_config_missing_file_and_syntax_error(tmp_path):
    missing = trainguard("check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and f"{tmp_path / 'nope.toml'}: file not found" in missing.stderr
    broken = write_config(tmp_path, "[filesystems\n")
    result = trainguard("check-config", str(broken))
    assert result.returncode == 2 and "TOML syntax error" in result.stderr and "line 1" in result.stderr


@pytest.mark.parametrize("url, problem", [
    ("json://user:PASSWORD9@alertbridge:99999/hook", "port 99999 is out of range (1-65535)"),
    ("json://alertbridge:0/TOKEN9path", "port 0 is out of range (1-65535)"),
    ("mailtos://user:PASSWORD9@smtp.example.com:70000", "port 70000 is out of range (1-65535)"),
    ("mailtos://user:PASSWORD9@example.com?smtp=smtp_server!", "its smtp is not a valid host name or address"),
])
def test_check_config_refuses_an_apprise_port_or_host_that_cannot_work_naming_the_target(tmp_path, url, problem):
    path = write_config(tmp_path, f'[[notify.targets]]\nname = "hook"\nurl = "{url}"\n'
                                  '[[notify.targets]]\nname = "fine"\nurl = "json://alertbridge:8080/hook"\n')
    result = trainguard("check-config", str(path))
    assert result.returncode == 2
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith(f"{path}: ")]
    assert line.startswith(f"{path}: notify.targets: target 'hook': {problem} in ") and "'fine'" not in line
    assert "PASSWORD9" not in result.stderr and "TOKEN9" not in result.stderr


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_config_path_is_honoured_wherever_it_is_given(tmp_path, where):
    # `trainguard --config X run` used to run the built-in defaults without a word.
    path = write_config(tmp_path, "[general]\ninterval = '1m'\n")
    args = {"before": ["--config", str(path), "check-config"], "after": ["check-config", "--config", str(path)],
            "env": ["check-config"]}[where]
    env = cli_env(TRAINGUARD_CONFIG=str(path)) if where == "env" else None
    result = trainguard(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"# valid: {path}")


def test_state_dir_before_the_subcommand_is_honoured(tmp_path):
    path = write_config(tmp_path, f"[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\n")
    result = trainguard("--state-dir", str(tmp_path / "state"), "--config", str(path), "run", "--once")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "state" / "state.db").exists()


def test_run_once_exits_1_on_a_critical_finding(tmp_path):
    path = write_config(tmp_path, f'[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\nwarning = "0%"\n'
                                  'critical = "0%"\n')
    result = trainguard("run", "--once", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 1, result.stderr
    (line,) = [ln for ln in result.stdout.splitlines() if not ln.startswith("GPU: ")]  # no GPU on a CI host
    assert line.startswith("[CRITICAL] ") and "% full" in line and "(fs.usage:" in line
    assert "retry in" not in result.stdout + result.stderr, "a one-shot run does not retry NVML"


def test_run_once_exits_0_on_warnings_and_reports_a_missing_path(tmp_path):
    missing = tmp_path / "checkpoints"
    path = write_config(tmp_path, f'[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}, {str(missing)!r}]\n')
    result = trainguard("run", "--once", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert f"[WARNING] watched path {missing} does not exist (fs.path_missing:{missing})" in result.stdout


def test_run_once_no_findings(tmp_path):
    path = write_config(tmp_path, f'[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\nwarning = "100%"\n'
                                  'critical = "100%"\n')
    result = trainguard("run", "--once", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    lines = [ln for ln in result.stdout.splitlines() if not ln.startswith("GPU: ")]  # no GPU on a CI host
    assert result.returncode == 0 and lines == ["no findings on 1 filesystems"], result.stderr


def test_run_with_a_bad_config_exits_2(tmp_path):
    path = write_config(tmp_path, "[filesystems]\nwarning = '150%'\n")
    result = trainguard("run", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2 and "filesystems.warning" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_logs_findings_and_stops_cleanly_on_a_signal(tmp_path, sig):
    missing = tmp_path / "ckpt"
    path = write_config(tmp_path, f'[general]\ninterval = "200ms"\n[alerts]\nkeep_firing_for = "1s"\n'
                                  f'[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}, {str(missing)!r}]\n')
    with Daemon("--config", str(path), "--state-dir", str(tmp_path / "s")) as d:
        d.wait_for(r"started: config .*trainguard\.toml")
        d.wait_for(r"watching 1 mount: /\S* \(\w+")  # which mounts it watches, said once at start
        d.wait_for(rf"FIRING \[warning\] watched path {missing} does not exist")
        missing.mkdir()  # the path appears: the daemon keeps running and resolves it
        d.wait_for(rf"RESOLVED \[warning\] watched path {missing} does not exist", timeout=30)
        assert d.stop(sig) == 0
        assert d.proc.poll() == 0
        d.wait_for(r"stopped")
        fired = [ln for ln in d.lines if "FIRING" in ln]
        assert len(fired) == 1, "one line per event, not one per cycle"


def test_run_without_any_config_runs_the_embedded_default(tmp_path):
    if os.path.exists(configmod.DEFAULT_CONFIG_PATH):
        pytest.skip(f"{configmod.DEFAULT_CONFIG_PATH} exists on this host")
    with Daemon("--state-dir", str(tmp_path / "s")) as d:
        d.wait_for(r"started: config built-in defaults, state .*, interval 10s")
        assert d.stop() == 0


def test_the_configured_state_dir_falls_back_with_a_warning(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    path = write_config(tmp_path, f"[general]\nstate_dir = {str(blocked / 'state')!r}\n"
                                  f"[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\n")
    env = cli_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    result = trainguard("run", "--once", "--config", str(path), env=env)
    assert result.returncode == 0, result.stderr
    assert f"state dir {blocked / 'state'} is not writable; using {tmp_path / 'xdg' / 'trainguard'}" in result.stderr
    assert (tmp_path / "xdg" / "trainguard" / "state.db").exists()


def test_an_explicit_state_dir_that_cannot_be_used_is_an_error_not_a_fallback(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    path = write_config(tmp_path, f"[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\n")
    env = cli_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    for argv in (["run", "--once"], ["run"]):
        result = trainguard(*argv, "--config", str(path), "--state-dir", str(blocked / "state"), env=env)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.splitlines() == [
            f"trainguard: --state-dir {blocked / 'state'}: cannot use it as the state directory (Not a directory)"]
    assert not (tmp_path / "xdg").exists()


def test_a_corrupt_state_database_does_not_stop_the_daemon(tmp_path):
    state = tmp_path / "s"
    state.mkdir()
    (state / "state.db").write_bytes(b"garbage" * 1000)
    path = write_config(tmp_path, f"[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\n")
    result = trainguard("run", "--once", "--config", str(path), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    assert "is unusable" in result.stderr and "started a fresh one" in result.stderr
    assert any(p.name.startswith("state.db.corrupt-") for p in state.iterdir())


def test_status_json_and_table(tmp_path):
    path = write_config(tmp_path, f'[filesystems]\n{ONLY}paths = [{str(tmp_path)!r}]\nwarning = "0%"\n'
                                  'critical = "100%"\n')
    result = trainguard("status", "--json", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (fs,) = doc["filesystems"]
    st = os.statvfs(tmp_path)
    assert fs["size_bytes"] == st.f_blocks * st.f_frsize
    assert fs["state"] == "warning" and fs["responsive"] is True and fs["kind"] in ("local", "network", "fuse")
    assert doc["findings"][0]["key"] == f"fs.usage:{fs['mountpoint']}"
    assert doc["daemon_state"] is False
    table = trainguard("status", "--config", str(path), "--state-dir", str(tmp_path / "s"))
    assert table.returncode == 0
    assert table.stdout.splitlines()[2].split() == ["MOUNT", "FSTYPE", "DEVICE", "SIZE", "USED", "LAST", "24H",
                                                    "24H", "RANGE", "INODES", "IO", "ETA", "FULL", "STATE"]
    assert "[WARNING]" in table.stdout
    # A one-shot command does not retry: it never says when it would (the daemon's "(retry in 10s)").
    assert "retry in" not in table.stdout + result.stdout and doc["gpu_status"]["next_retry"] is None
