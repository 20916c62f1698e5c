"""Configuration: a bad file is refused with one clear line per problem, never silently half-applied."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from trainguard import config
from trainguard.config import ConfigError


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config.load(str(path), environ or {})
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.problems)
    sources = (f"{path}: ", *(f"{name}: " for name in environ or {}))
    assert all(line.startswith(sources) for line in lines), "every line names the file or the variable"
    return lines


def test_no_file_runs_the_embedded_defaults(monkeypatch):
    if os.path.exists(config.DEFAULT_CONFIG_PATH):
        pytest.skip(f"{config.DEFAULT_CONFIG_PATH} exists on this host")
    loaded = config.load(None, {})
    assert loaded.source == "built-in defaults"
    fs = loaded.config.filesystems
    assert (fs.warning, fs.critical, fs.paths) == (0.85, 0.90, [])
    assert loaded.config.forecast.warning == 6 * 3600 and loaded.config.forecast.critical == 3600
    assert loaded.config.io.util_threshold == 0.9 and loaded.config.io.for_ == 300
    assert loaded.config.alerts.repeat_interval == 4 * 3600
    assert fs.probe_timeout == 5.0 and fs.hysteresis == pytest.approx(0.03)


def test_human_units_and_the_env_variable_path(tmp_path):
    path = write(tmp_path, """
[general]
interval = "30s"
[filesystems]
warning = "80%"
critical = 0.95
paths = ["/data", "/root/autodl-tmp"]
for = "2m"
[[filesystems.overrides]]
match = "/root/autodl-*"
critical = "98%"
[forecast]
window = "2h"
min_span = "10m"
""")
    loaded = config.load(None, {"TRAINGUARD_CONFIG": str(path)})
    cfg = loaded.config
    assert loaded.source == str(path)
    assert cfg.general.interval == 30 and cfg.filesystems.for_ == 120
    assert cfg.filesystems.thresholds_for("/root/autodl-tmp").critical == 0.98
    assert cfg.filesystems.thresholds_for("/data").critical == 0.95
    assert cfg.forecast.window == 7200 and cfg.forecast.min_span == 600


def test_explicit_path_wins_over_the_env_variable(tmp_path):
    a = write(tmp_path, "[general]\ninterval = '1m'\n", "a.toml")
    b = write(tmp_path, "[general]\ninterval = '2m'\n", "b.toml")
    assert config.load(str(a), {"TRAINGUARD_CONFIG": str(b)}).config.general.interval == 60


def test_missing_file_is_an_error_not_defaults(tmp_path):
    # A typo in --config must not quietly run with defaults that watch nothing the user wanted.
    missing = tmp_path / "nope.toml"
    assert problems_of(missing) == [f"{missing}: file not found"]
    with pytest.raises(ConfigError, match="file not found"):
        config.load(None, {"TRAINGUARD_CONFIG": str(missing)})


def test_directory_and_non_utf8_files_are_refused(tmp_path):
    assert "is a directory" in problems_of(tmp_path)[0]
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"[general]\nhostname = '\xe9t\xe9'\n")
    assert "not UTF-8" in problems_of(bad)[0]


@pytest.mark.parametrize("slowfs", [{"name": "confd"}], indirect=True)
def test_unreadable_file_says_permission_denied(slowfs):
    # Root reads any local file, so the refusal comes from a real filesystem that answers EACCES.
    path = slowfs.mountpoint / "config.toml"
    path.write_text("[general]\ninterval = '10s'\n")
    slowfs.fail("open", errno.EACCES)
    assert problems_of(path) == [f"{path}: permission denied (cannot read the file)"]


def test_toml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "[general]\ninterval = '10s'\n\n[filesystems\nwarning = '80%'\n")
    (line,) = problems_of(path)
    assert "TOML syntax error" in line and "line 4" in line


def test_every_problem_is_reported_at_once_one_line_each(tmp_path):
    path = write(tmp_path, """
bogus_section = 1
[general]
interval = "soon"
hostname = 5
[filesystems]
warning = "-5%"
critical = "150%"
paths = "/data"
probe_timeout = "-1s"
[[filesystems.overrides]]
match = "/data"
warnign = "80%"
[forecast]
enabled = "perhaps"
""")
    lines = problems_of(path)
    text = "\n".join(lines)
    expected = {
        "bogus_section: unknown key": None,
        "general.interval: 'soon' is not a duration": "30s",
        "general.hostname:": "string",
        "filesystems.warning: '-5%' is outside 0%..100%": None,
        "filesystems.critical: '150%' is outside 0%..100%": None,
        "filesystems.paths:": "list",
        "filesystems.probe_timeout:": None,
        "filesystems.overrides.0.warnign: unknown key": None,
        "forecast.enabled:": "bool",
    }
    for head, allowed in expected.items():
        line = next((ln for ln in lines if head in ln), None)
        assert line is not None, f"no line for {head!r} in:\n{text}"
        if allowed:
            assert allowed in line, line
    assert len(lines) == len(expected), text
    assert "'/data'" in next(ln for ln in lines if "filesystems.paths" in ln), "the bad value is shown"


@pytest.mark.parametrize("body, says", [
    ("[filesystems]\nwarning = '95%'\ncritical = '90%'\n", "warning (95%) is above critical (90%)"),
    ("[filesystems]\ninodes_warning = '99%'\n", "inodes_warning (99%) is above inodes_critical (90%)"),
    ("[[filesystems.overrides]]\nmatch = '/data'\nwarning = '95%'\n", "warning (95%) is above critical (90%)"),
    ("[[filesystems.overrides]]\nmatch = '/data'\ncritical = '80%'\n", "warning (85%) is above critical (80%)"),
    ("[forecast]\nwarning = '30m'\ncritical = '2h'\n", "critical"),
    ("[forecast]\nwindow = '1h'\nmin_span = '2h'\n", "min_span"),
])
def test_inverted_levels_are_refused(tmp_path, body, says):
    # An override that puts its warning above the critical level used to be accepted and then broke the
    # filesystem detector on every cycle for every mount.
    (line,) = problems_of(write(tmp_path, body))
    assert says in line


def test_override_problem_names_which_override(tmp_path):
    path = write(tmp_path, "[[filesystems.overrides]]\nmatch = '/ok'\n"
                           "[[filesystems.overrides]]\nmatch = '/root/autodl-*'\nwarning = '95%'\n")
    (line,) = problems_of(path)
    assert "overrides" in line and "/root/autodl-*" in line


def test_secrets_are_never_echoed(tmp_path):
    token = "dingtalk://SECRETTOKEN123@SECRETKEY456/"
    path = write(tmp_path, f"""
[[notify.targets]]
name = "ops"
url = 5
[[notify.targets]]
name = "dt"
url = "{token}"
token = "{token}"
""")
    text = "\n".join(problems_of(path, {"TRAINGUARD_NOTIFY__PASSWORD": "hunter2"}))
    assert "notify.targets.0.url" in text and "value hidden" in text
    assert "notify.targets.1.token: unknown key" in text
    assert "SECRET" not in text and "hunter2" not in text


def test_dump_redacts_secret_urls(tmp_path):
    path = write(tmp_path, "[[notify.targets]]\nname = 'dt'\nurl = 'dingtalk://SECRETTOKEN@SECRETKEY/'\n")
    dumped = config.dump(config.load(str(path), {}).config)
    assert dumped["notify"]["targets"][0]["url"] == "dingtalk://***@***/"
    assert "SECRET" not in repr(dumped)


def test_env_overrides_nest_and_parse_json_lists(tmp_path):
    path = write(tmp_path, "[filesystems]\nwarning = '70%'\ncritical = '95%'\n")
    env = {"TRAINGUARD_FILESYSTEMS__WARNING": "80%", "TRAINGUARD_FILESYSTEMS__PATHS": '["/data", "/scratch"]',
           "TRAINGUARD_GENERAL__INTERVAL": "1m", "TRAINGUARD_UNRELATED": "x", "OTHER__THING": "y"}
    cfg = config.load(str(path), env).config
    assert cfg.filesystems.warning == 0.8 and cfg.filesystems.critical == 0.95
    assert cfg.filesystems.paths == ["/data", "/scratch"]
    assert cfg.general.interval == 60


def test_retired_sys_root_still_loads_with_a_warning(tmp_path, caplog):
    """general.sys_root was never read; a config or a compose file that still sets it keeps working."""
    path = write(tmp_path, "[general]\nsys_root = '/host/sys'\ninterval = '30s'\n")
    for loaded in (config.load(str(path), {}), config.load(None, {"TRAINGUARD_GENERAL__SYS_ROOT": "/host/sys"})):
        assert "sys_root" not in config.dump(loaded.config)["general"]
    assert config.load(str(path), {}).config.general.interval == 30
    assert "general.sys_root (TRAINGUARD_GENERAL__SYS_ROOT) is no longer used" in caplog.text


def test_bad_env_override_is_reported_like_a_bad_key():
    with pytest.raises(ConfigError) as info:
        config.load(None, {"TRAINGUARD_FILESYSTEMS__CRITICAL": "900%", "TRAINGUARD_FILESYSTEMS__TYPO": "1"})
    text = str(info.value)
    assert "filesystems.critical: '900%' is outside 0%..100%" in text
    assert "filesystems.typo: unknown key" in text


def test_overrides_match_mount_point_or_glob_and_ignore():
    cfg = config.parse({"filesystems": {
        "exclude": ["/mnt/scratch*"],
        "overrides": [
            {"match": "/data", "warning": "95%", "critical": "98%"},
            {"match": "/root/autodl-*", "critical": "99%"},
            {"match": "/var/cache/*", "ignore": True},
        ]}}, "test")
    fs = cfg.filesystems
    assert (fs.thresholds_for("/data").warning, fs.thresholds_for("/data").critical) == (0.95, 0.98)
    assert fs.thresholds_for("/data2").warning == 0.85, "a mount point match is exact, not a prefix"
    assert fs.thresholds_for("/root/autodl-tmp").critical == 0.99
    assert fs.ignored("/var/cache/big") and fs.ignored("/mnt/scratch2") and not fs.ignored("/data")


def test_two_matching_overrides_never_break_threshold_lookup():
    # Each override is in order on its own; together on one mount they invert. Lookup must still answer.
    cfg = config.parse({"filesystems": {"overrides": [
        {"match": "/data*", "warning": "95%", "critical": "98%"},
        {"match": "/data/ckpt", "critical": "92%"},
    ]}}, "test")
    t = cfg.filesystems.thresholds_for("/data/ckpt")
    assert (t.warning, t.critical) == (0.95, 0.92)
