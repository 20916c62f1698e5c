"""A sweep of bad configurations, as careless users and attackers write them.

Each one, given to the real `trainguard check-config` process, must exit 2 with exactly one problem
line that names the key (or the TRAINGUARD_* variable), with no traceback and no secret, quickly.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

SECRET = "S3CRETtok"  # planted in every URL and token below; must never be printed
REPO = Path(__file__).resolve().parents[1]
CLEANUP = '[[cleanup]]\nname = "x"\ntype = "age"\nroots = ["/data/x"]\n'
CKPT = '[[cleanup]]\nname = "c"\ntype = "checkpoints"\nroots = ["/data/runs"]\n'
LOGS = '[[logs]]\npaths = ["/data/train.log"]\n'
MIRROR = '[[mirror]]\nname = "m"\nsource = "/data/runs"\ndest = "/share/runs"\n'
TARGET = f'[[notify.targets]]\nname = "dt"\nurl = "dingtalk://{SECRET}@{SECRET}x/"\n'

# (case id, TOML text, the key path the one line must name)
TOML_CASES = [
    ("interval-zero", '[general]\ninterval = "0s"', "general.interval"),
    ("interval-negative", '[general]\ninterval = "-1s"', "general.interval"),
    ("interval-word", '[general]\ninterval = "soon"', "general.interval"),
    ("interval-bool", "[general]\ninterval = true", "general.interval"),
    ("interval-inf", '[general]\ninterval = "inf"', "general.interval"),
    ("hostname-int", "[general]\nhostname = 5", "general.hostname"),
    ("state-dir-list", "[general]\nstate_dir = []", "general.state_dir"),
    ("log-level", '[general]\nlog_level = "verbose"', "general.log_level"),
    ("general-unknown", "[general]\nintervall = 5", "general.intervall"),
    ("warning-over-100", '[filesystems]\nwarning = "120%"', "filesystems.warning"),
    ("warning-negative", '[filesystems]\nwarning = "-5%"', "filesystems.warning"),
    ("warning-word", '[filesystems]\nwarning = "high"', "filesystems.warning"),
    ("warning-nan", '[filesystems]\nwarning = "nan"', "filesystems.warning"),
    ("critical-below-warning", '[filesystems]\nwarning = "95%"\ncritical = "90%"', "filesystems"),
    ("inodes-ratio-2", "[filesystems]\ninodes_warning = 2", "filesystems.inodes_warning"),
    ("paths-string", '[filesystems]\npaths = "/data"', "filesystems.paths"),
    ("paths-int", "[filesystems]\npaths = [1]", "filesystems.paths"),
    ("exclude-int", "[filesystems]\nexclude = 5", "filesystems.exclude"),
    ("probe-timeout-zero", '[filesystems]\nprobe_timeout = "0s"', "filesystems.probe_timeout"),
    ("probe-timeout-unit", '[filesystems]\nprobe_timeout = "1y"', "filesystems.probe_timeout"),
    ("hysteresis", '[filesystems]\nhysteresis = "150%"', "filesystems.hysteresis"),
    ("fs-for-negative", '[filesystems]\nfor = "-1m"', "filesystems.for"),
    ("override-match-int", "[[filesystems.overrides]]\nmatch = 1", "filesystems.overrides.0.match"),
    ("override-no-match", '[[filesystems.overrides]]\nwarning = "90%"', "filesystems.overrides.0.match"),
    ("override-unknown", '[[filesystems.overrides]]\nmatch = "/x"\nfoo = 1', "filesystems.overrides.0.foo"),
    ("override-inverted", '[[filesystems.overrides]]\nmatch = "/x"\nwarning = "99%"\ncritical = "91%"',
     "filesystems.overrides"),
    ("forecast-window-zero", '[forecast]\nwindow = "0s"', "forecast.window"),
    ("forecast-min-span", '[forecast]\nwindow = "1h"\nmin_span = "2h"', "forecast"),
    ("forecast-critical-longer", '[forecast]\nwarning = "1h"\ncritical = "2h"', "forecast"),
    ("forecast-warning-zero", '[forecast]\nwarning = "0s"', "forecast.warning"),
    ("forecast-enabled", '[forecast]\nenabled = "maybe"', "forecast.enabled"),
    ("io-threshold", '[io]\nutil_threshold = "2"', "io.util_threshold"),
    ("io-for", '[io]\nfor = "x"', "io.for"),
    ("repeat-zero", '[alerts]\nrepeat_interval = "0s"', "alerts.repeat_interval"),
    ("keep-firing-negative", '[alerts]\nkeep_firing_for = "-1s"', "alerts.keep_firing_for"),
    ("raw-retention-zero", '[history]\nraw_retention = "0s"', "history.raw_retention"),
    ("retention-word", '[history]\nretention = "forever"', "history.retention"),
    ("rollup-zero", "[history]\nrollup = 0", "history.rollup"),
    ("target-plain-string", f'[notify]\ntargets = ["dingtalk://{SECRET}@{SECRET}x/"]', "notify.targets.0"),
    ("target-table-string", f'notify = {{targets = ["json://user:{SECRET}@host/hook"]}}', "notify.targets.0"),
    ("target-no-url", '[[notify.targets]]\nname = "a"', "notify.targets.0.url"),
    ("target-no-scheme", f'[[notify.targets]]\nname = "a"\nurl = "{SECRET}"', "notify.targets.0"),
    ("target-severity", TARGET + 'severity = "urgent"', "notify.targets.0.severity"),
    ("target-timeout-zero", TARGET + 'timeout = "0s"', "notify.targets.0.timeout"),
    ("target-rate-negative", TARGET + "rate_limit = -1", "notify.targets.0.rate_limit"),
    ("target-tags-string", TARGET + 'tags = "fs"', "notify.targets.0.tags"),
    ("target-unknown", TARGET + f'token = "{SECRET}"', "notify.targets.0.token"),
    ("target-names-twice", TARGET + TARGET.replace("[[", "\n[["), "notify"),
    ("retry-order", '[notify]\nretry_initial = "1h"\nretry_max = "1m"', "notify"),
    ("retry-zero", '[notify]\nretry_initial = "0s"', "notify.retry_initial"),
    ("max-pending-zero", "[notify]\nmax_pending = 0", "notify.max_pending"),
    ("group-wait-word", '[notify]\ngroup_wait = "x"', "notify.group_wait"),
    ("max-age-zero", '[notify]\nmax_age = "0s"', "notify.max_age"),
    ("gpu-vram", '[gpu]\nvram_ratio = "200%"', "gpu.vram_ratio"),
    ("gpu-floor-negative", "[gpu]\nutil_floor = -1", "gpu.util_floor"),
    ("gpu-for", '[gpu]\nfor = "0x"', "gpu.for"),
    ("gpu-override-ratio", '[[gpu.overrides]]\nmatch = "0"\nvram_ratio = "3"', "gpu.overrides.0.vram_ratio"),
    ("gpu-throttle-reason", '[gpu]\nthrottle_reasons = ["too_hot"]', "gpu.throttle_reasons.0"),
    ("gpu-host-pid", '[gpu]\nhost_pid_namespace = "maybe"', "gpu.host_pid_namespace"),
    ("gpu-py-spy", '[gpu]\npy_spy = "sure"', "gpu.py_spy"),
    ("gpu-interval-zero", '[gpu]\ninterval = "0s"', "gpu.interval"),
    ("gpu-orphan-negative", '[gpu]\norphan_for = "-1s"', "gpu.orphan_for"),
    ("logs-no-paths", "[[logs]]\npaths = []", "logs.0.paths"),
    ("logs-empty-path", '[[logs]]\npaths = [""]', "logs.0.paths"),
    ("logs-empty-pattern", LOGS + 'patterns = [""]', "logs.0.patterns"),
    ("logs-bad-regex", LOGS + 'patterns = ["(unclosed"]', "logs.0.patterns"),
    ("logs-observer", LOGS + 'observer = "fanotify"', "logs.0.observer"),
    ("logs-hold-zero", LOGS + 'hold = "0s"', "logs.0.hold"),
    ("logs-severity", LOGS + 'severity = "info"', "logs.0.severity"),
    ("logs-missing-paths", '[[logs]]\nseverity = "warning"', "logs.0.paths"),
    ("max-delete-table-unknown", CLEANUP + "max_delete = {foo = 1}", "cleanup.0.age.max_delete"),
    ("max-delete-table-negative", CLEANUP + "max_delete = {files = -1}", "cleanup.0.age.max_delete"),
    ("max-delete-negative", CLEANUP + "max_delete = -5", "cleanup.0.age.max_delete"),
    ("max-delete-word", CLEANUP + 'max_delete = "many"', "cleanup.0.age.max_delete"),
    ("max-delete-bool", CLEANUP + "max_delete = true", "cleanup.0.age.max_delete"),
    ("root-slash", CLEANUP.replace("/data/x", "/"), "cleanup.0.age"),
    ("root-relative", CLEANUP.replace("/data/x", "data/x"), "cleanup.0.age"),
    ("root-etc", CLEANUP.replace("/data/x", "/etc/app"), "cleanup.0.age"),
    ("root-home", CLEANUP.replace("/data/x", "/home"), "cleanup.0.age"),
    ("root-dotdot", CLEANUP.replace("/data/x", "/data/../etc"), "cleanup.0.age"),
    ("root-nul", CLEANUP.replace("/data/x", "/data/x\\u0000y"), "cleanup.0.age"),
    ("policy-name-space", CLEANUP.replace('"x"', '"bad name!"'), "cleanup.0.age.name"),
    ("policy-name-empty", CLEANUP.replace('"x"', '""'), "cleanup.0.age.name"),
    ("policy-type", CLEANUP.replace('"age"', '"nope"'), "cleanup.0"),
    ("policy-no-type", '[[cleanup]]\nname = "x"\nroots = ["/data/x"]', "cleanup.0"),
    ("policy-watermarks", CLEANUP + 'high = "70%"\nlow = "80%"', "cleanup.0.age"),
    ("policy-schedule", CLEANUP + 'schedule = "10s"', "cleanup.0.age"),
    ("policy-empty-glob", CLEANUP + 'patterns = [""]', "cleanup.0.age"),
    ("policy-age-by-empty", CLEANUP + "age_by = []", "cleanup.0.age.age_by"),
    ("policy-age-by-btime", CLEANUP + 'age_by = ["btime"]', "cleanup.0.age.age_by.0"),
    ("policy-names-twice", CLEANUP + "\n" + CLEANUP, "cleanup"),
    ("keep-last-zero", CKPT + "keep_last = 0", "cleanup.0.checkpoints.keep_last"),
    ("keep-every-zero", CKPT + "keep_every = 0", "cleanup.0.checkpoints.keep_every"),
    ("checkpoints-no-roots", '[[cleanup]]\nname = "c"\ntype = "checkpoints"', "cleanup.0.checkpoints"),
    ("cache-no-limit", '[[cleanup]]\nname = "p"\ntype = "pip-cache"', "cleanup.0.pip-cache"),
    ("cache-size-word", '[[cleanup]]\nname = "p"\ntype = "pip-cache"\nmax_size = "big"',
     "cleanup.0.pip-cache.max_size"),
    ("listen-port", '[metrics]\nlisten = "127.0.0.1:70000"', "metrics.listen"),
    ("listen-no-port", '[metrics]\nlisten = "nohost"', "metrics.listen"),
    ("listen-int", "[metrics]\nlisten = 9842", "metrics.listen"),
    ("mirror-relative", MIRROR.replace('"/data/runs"', '"data/runs"'), "mirror.0"),
    ("mirror-dest-inside", MIRROR.replace('"/share/runs"', '"/data/runs/copy"'), "mirror.0"),
    ("mirror-same", MIRROR.replace('"/share/runs"', '"/data/runs"'), "mirror.0"),
    ("mirror-every-zero", MIRROR + 'every = "0s"', "mirror.0.every"),
    ("mirror-names-twice", MIRROR + "\n" + MIRROR, "mirror"),
    ("mirror-no-dest", '[[mirror]]\nname = "m"\nsource = "/data/runs"', "mirror.0.dest"),
    ("unknown-section", "[filesystem]\nwarning = 0.5", "filesystem"),
    ("deep-nesting", "a = " + "[" * 3000 + "]" * 3000, "nested too deeply"),
    ("toml-syntax", "[filesystems\nwarning = 1", "TOML syntax error"),
    ("section-is-scalar", "general = 5", "general"),
]

# (case id, environment, the variable the one line must name)
ENV_CASES = [
    ("env-empty-key", {"TRAINGUARD___": "1"}, "TRAINGUARD___"),
    ("env-empty-inner-key", {"TRAINGUARD_GENERAL____INTERVAL": "5s"}, "TRAINGUARD_GENERAL____INTERVAL"),
    ("env-scalar-and-nested", {"TRAINGUARD_GENERAL": "x", "TRAINGUARD_GENERAL__INTERVAL": "5s"},
     "TRAINGUARD_GENERAL__INTERVAL"),
    ("env-single-underscore", {"TRAINGUARD_GENERAL_INTERVAL": "5s"}, "TRAINGUARD_GENERAL_INTERVAL"),
    ("env-unknown-section", {"TRAINGUARD_FOO__BAR": "1"}, "TRAINGUARD_FOO__BAR"),
    ("env-interval-zero", {"TRAINGUARD_GENERAL__INTERVAL": "0s"}, "TRAINGUARD_GENERAL__INTERVAL"),
    ("env-warning-word", {"TRAINGUARD_FILESYSTEMS__WARNING": "abc"}, "TRAINGUARD_FILESYSTEMS__WARNING"),
    ("env-unknown-key", {"TRAINGUARD_FILESYSTEMS__WARNIGN": "80%"}, "TRAINGUARD_FILESYSTEMS__WARNIGN"),
    ("env-targets-broken-json", {"TRAINGUARD_NOTIFY__TARGETS": f'[{{"name": "a", "url": "dingtalk://{SECRET}@x/"'},
     "TRAINGUARD_NOTIFY__TARGETS"),
    ("env-targets-plain-url", {"TRAINGUARD_NOTIFY__TARGETS": f"dingtalk://{SECRET}@{SECRET}x/"},
     "TRAINGUARD_NOTIFY__TARGETS"),
    ("env-targets-string-items", {"TRAINGUARD_NOTIFY__TARGETS": f'["json://u:{SECRET}@host/hook"]'},
     "TRAINGUARD_NOTIFY__TARGETS"),
    ("env-targets-indexed", {"TRAINGUARD_NOTIFY__TARGETS__0__URL": f"dingtalk://{SECRET}@x/"},
     "TRAINGUARD_NOTIFY__TARGETS__0__URL"),
    ("env-target-no-scheme", {"TRAINGUARD_NOTIFY__TARGETS": f'[{{"name": "a", "url": "{SECRET}"}}]'},
     "TRAINGUARD_NOTIFY__TARGETS"),
    ("env-vram", {"TRAINGUARD_GPU__VRAM_RATIO": "2"}, "TRAINGUARD_GPU__VRAM_RATIO"),
    ("env-listen", {"TRAINGUARD_METRICS__LISTEN": ":99999"}, "TRAINGUARD_METRICS__LISTEN"),
    ("env-cleanup-root", {"TRAINGUARD_CLEANUP": '[{"name": "x", "type": "age", "roots": ["/"]}]'},
     "TRAINGUARD_CLEANUP"),
    ("env-logs-empty", {"TRAINGUARD_LOGS": '[{"paths": []}]'}, "TRAINGUARD_LOGS"),
    ("env-mirror-relative", {"TRAINGUARD_MIRROR": '[{"name": "m", "source": "a", "dest": "/b"}]'},
     "TRAINGUARD_MIRROR"),
    ("env-log-level", {"TRAINGUARD_GENERAL__LOG_LEVEL": "verbose"}, "TRAINGUARD_GENERAL__LOG_LEVEL"),
    ("env-group-wait", {"TRAINGUARD_NOTIFY__GROUP_WAIT": "-1s"}, "TRAINGUARD_NOTIFY__GROUP_WAIT"),
    ("env-paths-broken-json", {"TRAINGUARD_FILESYSTEMS__PATHS": '["/a",'}, "TRAINGUARD_FILESYSTEMS__PATHS"),
    ("env-section-json", {"TRAINGUARD_GENERAL": '{"interval": "0s"}'}, "TRAINGUARD_GENERAL"),
    ("env-section-scalar", {"TRAINGUARD_FORECAST": "on"}, "TRAINGUARD_FORECAST"),
    ("env-deep-json", {"TRAINGUARD_FILESYSTEMS__PATHS": "[" * 5000 + "]" * 5000}, "TRAINGUARD_FILESYSTEMS__PATHS"),
    ("env-keep-last", {"TRAINGUARD_CLEANUP": '[{"name": "c", "type": "checkpoints", "roots": ["/d/r"], '
                                             '"keep_last": -1}]'}, "TRAINGUARD_CLEANUP"),
    ("env-probe-timeout", {"TRAINGUARD_FILESYSTEMS__PROBE_TIMEOUT": "0"}, "TRAINGUARD_FILESYSTEMS__PROBE_TIMEOUT"),
]


def _check_config(path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run check-config; return the result, its wall time and the CPU time the child used.

    The 2 s budget is checked on the child's own CPU time, so a loaded test machine cannot fail it;
    the wall time only guards against a hang (a FIFO read blocks without using any CPU)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    clean["PYTHONPATH"] = str(REPO / "daemon")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "trainguard", "check-config", str(path)], env={**clean, **env},
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, wall, cpu


def _run_all(tmp_path: Path):
    jobs = []
    for case, text, expect in TOML_CASES:
        path = tmp_path / f"{case}.toml"
        path.write_text(text + "\n")
        jobs.append((case, expect, path, {}))
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    jobs += [(case, expect, empty, env) for case, env, expect in ENV_CASES]
    for case, expect, path, env in jobs:  # one at a time: CPU time is measured per child
        yield (case, expect, *_check_config(path, env))


def test_every_bad_config_is_one_clear_line_with_exit_2(tmp_path):
    assert len(TOML_CASES) + len(ENV_CASES) >= 100
    failures = []
    for case, expect, result, wall, cpu in _run_all(tmp_path):
        problems = [ln for ln in result.stderr.splitlines() if ln and ln != "invalid configuration:"]
        why = []
        if result.returncode != 2:
            why.append(f"exit {result.returncode}")
        if len(problems) != 1:
            why.append(f"{len(problems)} lines")
        elif expect not in problems[0]:
            why.append(f"does not name {expect!r}")
        if "Traceback" in result.stderr + result.stdout:
            why.append("traceback")
        if SECRET in result.stderr + result.stdout:
            why.append("echoes the secret")
        if cpu > 2.0 or wall > 10.0:
            why.append(f"took {cpu:.1f}s of CPU, {wall:.1f}s of wall time")
        if why:
            failures.append(f"{case}: {', '.join(why)}: {result.stderr.strip()[-300:]!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind", ["fifo", "directory", "not-utf8", "dev-zero"])
def test_a_path_that_is_no_toml_file_is_refused_at_once(tmp_path, kind):
    path = tmp_path / "config.toml"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes: reading it would block forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"[general]\nhostname = '\xff\xfe'\n")
    else:
        path = Path("/dev/zero")  # endless: reading it would never finish
    result, wall, cpu = _check_config(path, {})
    assert result.returncode == 2 and cpu < 2.0 and wall < 10.0, result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"{path}: ")
    assert "Traceback" not in result.stderr
