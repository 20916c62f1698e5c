"""Deployment files: the systemd unit, the fleet's alerting rules and the dashboard."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from trainguard.records import (
    DiskIo,
    Finding,
    FsSample,
    FsUsage,
    GpuSample,
    Mount,
    MountKind,
    NvmlState,
    NvmlStatus,
    Severity,
    Snapshot,
)
from trainguard.surfaces.exporter import Readings, ReadingsCollector
from trainguard.surfaces.readings import RunProgress

from tests.support.daemon_proc import REPO

UNIT = REPO / "systemd" / "trainguard.service"
RULES = REPO / "deploy" / "prometheus" / "trainguard.rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "trainguard.rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "trainguard.json"
DASHBOARD_SCHEMA = REPO / "deploy" / "grafana" / "dashboard.schema.json"
ALERTMANAGER = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
MAX_EXPOSURE = 3.5  # systemd-analyze security score; docs/service.md records the current figure


def exported_names() -> set[str]:
    """Every series name the collector can produce, with each optional family present."""
    m = Mount("/data", "ext4", "/dev/sda1", 8, 1, MountKind.LOCAL)
    usage = FsUsage(100, 50, 50, 10, 5, 5)
    gpu = GpuSample(0, "GPU-x", "H100", 1.0, util_ratio=0.0, memory_used_bytes=1, memory_total_bytes=2,
                    temperature_c=60.0, power_w=300.0, power_limit_w=400.0, throttle_reasons=0x40,
                    ecc_uncorrected=0, ecc_uncorrected_aggregate=0, retired_pages_by_cause={"double_bit": 0},
                    retired_pages_pending=False, remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
                    row_remap_pending=False, row_remap_failure=False, xid_counts={79: 1})
    snap = Snapshot(1.0, (FsSample(m, 1.0, usage),), (DiskIo("sda1", 8, 1, 0.5, 1.0, 1.0, 1.0),), gpus=(gpu,),
                    gpu_status=NvmlStatus(NvmlState.OK))
    stall = Finding("gpu.stall:0", Severity.CRITICAL, "x", details={"stalled_for_s": 1.0, "owners": [{"user": "alice"}]},
                    labels={"gpu": "0"})
    checkpoint = Finding("fs.next_checkpoint:/data", Severity.CRITICAL, "x")
    run = RunProgress("torchrun-4121", "j1", {"user": "alice"}, 300.0, 1.0, 10.0, ((0, 4122, 1.0),))
    r = Readings(snap, 1.0, 0.1, fill_eta={"/data": 10.0}, findings=(stall, checkpoint), cleanup_freed={"p": 1},
                 notify_failures={"t": 1}, runs=(run,))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadingsCollector(lambda: r))
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def referenced(text: str) -> set[str]:
    # Metric names, not the parts of recording rule names (instance:trainguard_gpus:count).
    return set(re.findall(r"(?<![:\w])trainguard_[a-z_]+\b(?!:)", text))


# Metrics the rules are written against that another part of the daemon adds (the mirror worker).
EXPORTED_ELSEWHERE = {"trainguard_mirror_lag_seconds"}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def test_rules_and_dashboard_only_use_metrics_the_daemon_exports():
    names = exported_names() | EXPORTED_ELSEWHERE
    rules_text = RULES.read_text()
    assert referenced(rules_text) - names == set()
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", ()))
    assert referenced(exprs) - names == set()
    # Recording rules the dashboard reads must be defined in the rules file.
    records = {r["record"] for g in yaml.safe_load(rules_text)["groups"] for r in g["rules"] if "record" in r}
    assert set(re.findall(r"\btrainguard:[a-z_:]+\b", exprs)) <= records


# Each kind of finding a registered detector makes: the fleet rule that alerts on it from the metrics alone,
# or why the fleet has none (the daemon's own alert still goes out).
FLEET_RULES = {
    "fs.usage": "TrainguardFilesystemAlmostFull",
    "fs.inodes": "TrainguardInodesAlmostExhausted",
    "fs.forecast": ("TrainguardFilesystemFilling", "TrainguardFilesystemFullSoon", "TrainguardFilesystemFullWithin6h"),
    "fs.unresponsive": "TrainguardMountUnresponsive",
    "fs.next_checkpoint": "TrainguardCheckpointWillNotFit",
    "disk.saturated": "TrainguardDiskSaturated",
    "gpu.stall": "TrainguardGpuStalled",
    "gpu.xid": "TrainguardGpuXidCritical",
    "gpu.throttle": "TrainguardGpuThrottled",
    "mirror.lag": "TrainguardMirrorLagging",
    "train.hang": "TrainguardTrainingJobHung",  # the daemon: one host's run; the fleet: every host of one job
    "train.exit": None,  # a run that ended with an error: its own output says why, the daemon's alert quotes it
    "fs.error": None,  # statfs failing for another reason than a hang: one host's problem, no fleet-wide series
    "fs.path_missing": None,  # a watched path that does not exist: a mistake in one host's config
    "gpu.orphan": None,  # memory held by an exited or zombie process: one host's cleanup, in trainguard_findings
    "log.match": None,  # a line in one run's log: the daemon's alert quotes it, a metric cannot
}


def detector_finding_kinds() -> dict[str, str]:
    """kind -> file, for the findings made by the modules of the detector registry (and the registry's own
    names that are kinds, such as log.match, whose key a helper builds)."""
    from trainguard.detectors import DETECTORS

    from tests.test_i18n import finding_kinds_in_code

    files = {f.__module__.removeprefix("trainguard.").replace(".", "/") + ".py" for f in DETECTORS.values()}
    kinds = {kind: path for kind, path in finding_kinds_in_code().items() if path in files}
    return {**{name: "detectors" for name in DETECTORS if "." in name}, **kinds}


def test_every_detector_has_a_fleet_rule():
    kinds = detector_finding_kinds()
    assert {"fs.usage", "fs.forecast", "gpu.stall", "mirror.lag"} <= set(kinds)  # the walk finds them
    unmapped = {k: f for k, f in kinds.items() if k not in FLEET_RULES}
    assert not unmapped, f"finding kinds with no fleet rule in FLEET_RULES (name one, or say why none): {unmapped}"
    assert set(FLEET_RULES) <= set(kinds), f"FLEET_RULES names kinds no detector makes: {set(FLEET_RULES) - set(kinds)}"
    names = alerts()
    for kind, rules in FLEET_RULES.items():
        for rule in (rules,) if isinstance(rules, str) else rules or ():
            assert rule in names, f"{kind}: no alert {rule} in {RULES.name}"


def test_every_alert_has_for_severity_values_and_a_runbook_page_in_this_repository():
    for name, rule in alerts().items():
        assert "for" in rule, name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert "{{" in notes["summary"] + notes["description"], f"{name}: no values in summary or description"
        assert notes["runbook_url"].endswith(f"/docs/runbooks/{name}.md"), name
        page = REPO / "docs" / "runbooks" / f"{name}.md"
        assert page.is_file(), f"{name}: {page} missing"
        text = page.read_text()
        assert text.startswith(f"# {name}\n"), page
        assert "## What to do" in text and "## Meaning" in text, page
    pages = {p.stem for p in (REPO / "docs" / "runbooks").glob("Trainguard*.md")}
    assert pages == set(alerts()), "one runbook page per alert, none left over"


def test_every_alert_is_unit_tested_firing_and_not_firing():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", ())]
    for name in alerts():
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it stays quiet"
    records = {r["record"] for r in rules() if "record" in r}
    tested = {c["expr"] for t in tests for c in t.get("promql_expr_test", ())}
    assert {r for r in records if r.startswith(("instance:", "job:"))} <= tested


def test_dashboard_validates_against_the_dashboard_schema():
    # No official JSON Schema of Grafana dashboards exists offline (Grafana's is CUE): the
    # schema is a hand-written subset of the fields an import needs; see its description.
    if shutil.which("check-jsonschema") is None:
        pytest.skip("check-jsonschema not installed (the test extra)")
    done = subprocess.run(["check-jsonschema", "--schemafile", str(DASHBOARD_SCHEMA), str(DASHBOARD)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("breakage", ["panel without targets", "too wide", "row without panels"])
def test_the_dashboard_schema_rejects_what_grafana_would(tmp_path, breakage):
    if shutil.which("check-jsonschema") is None:
        pytest.skip("check-jsonschema not installed (the test extra)")
    dashboard = json.loads(DASHBOARD.read_text())
    panel = next(p for p in dashboard["panels"] if p["type"] == "timeseries")
    row = next(p for p in dashboard["panels"] if p["type"] == "row")
    if breakage == "panel without targets":
        del panel["targets"]
    elif breakage == "too wide":
        panel["gridPos"]["w"] = 30
    else:
        del row["panels"]
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(dashboard))
    done = subprocess.run(["check-jsonschema", "--schemafile", str(DASHBOARD_SCHEMA), str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr


def test_dashboard_layout_has_a_fleet_overview_and_a_repeated_host_row():
    """What the schema cannot say: ids unique, no overlapping panels, host panels filter by host."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    rows = [p for p in panels if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["Fleet overview", "Host $instance"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert rows[1]["repeat"] in variables
    host_row_y = rows[1]["gridPos"]["y"]
    fleet = [p for p in panels if p["type"] != "row" and p["gridPos"]["y"] < host_row_y]
    host = [p for p in panels if p["type"] != "row" and p["gridPos"]["y"] > host_row_y]
    assert {"Top mounts by time to full", "Stalled GPUs"} <= {p["title"] for p in fleet}
    for p in host:
        for t in p["targets"]:
            assert '$instance' in t["expr"], f"host panel {p['title']!r} does not filter by host: {t['expr']}"
    host_exprs = " ".join(t["expr"] for p in host for t in p["targets"])
    for name in ("trainguard_gpu_temperature_celsius", "trainguard_gpu_power_limit_watts",
                 "trainguard_gpu_throttle_reason", "trainguard_gpu_xid_errors_total",
                 "trainguard_gpu_ecc_uncorrected_volatile_total", "trainguard_nvml_state"):
        assert name in host_exprs, name


def _promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package: prometheus)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules():
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_rules_pass():
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def _amtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("amtool") is None:
        pytest.skip("amtool not installed (Debian package: prometheus-alertmanager)")
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=120)


def test_amtool_accepts_the_example_alertmanager_config():
    done = _amtool("check-config", str(ALERTMANAGER))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("labels,receiver", [
    ({"alertname": "TrainguardGpuStalled", "severity": "critical"}, "dingtalk-oncall"),
    ({"alertname": "TrainguardFilesystemAlmostFull", "severity": "critical"}, "dingtalk-oncall"),
    ({"alertname": "TrainguardFilesystemFilling", "severity": "warning"}, "dingtalk-team"),
    ({"alertname": "TrainguardDown", "severity": "warning"}, "dingtalk-ops"),
    ({"alertname": "TrainguardNvmlUnavailable", "severity": "warning"}, "dingtalk-ops"),
])
def test_alertmanager_routes_critical_to_oncall_and_blind_hosts_to_ops(labels, receiver):
    done = _amtool("config", "routes", "test", f"--config.file={ALERTMANAGER}",
                   *(f"{k}={v}" for k, v in labels.items()))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [receiver]


def test_alertmanager_config_only_names_alerts_the_rules_define():
    text = ALERTMANAGER.read_text()
    named = set(re.findall(r"Trainguard[A-Za-z0-9]+", text)) - {"TrainguardGpuXid"}
    assert named - set(alerts()) == set()
    assert "TrainguardGpuXid" in alerts()


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_speaks_notify_with_a_watchdog_and_keeps_nvidia_devices():
    service = unit()["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert float(service["WatchdogSec"].rstrip("s")) >= 2 * 10  # twice the default interval at least
    assert service["ProtectSystem"] == "strict"
    assert service["ProtectHome"] == "read-only"
    assert service["StateDirectory"] == "trainguard"
    assert service["DevicePolicy"] == "closed"
    assert "PrivateDevices" not in service  # it would hide /dev/nvidia*
    assert "ExecReload" in service


@pytest.fixture
def installable_unit(tmp_path):
    """The shipped unit with ExecStart pointing at this machine's trainguard (verify checks it exists)."""
    exe = shutil.which("trainguard") or sys.executable
    path = tmp_path / "trainguard.service"
    path.write_text(UNIT.read_text().replace("/opt/trainguard/bin/trainguard", exe))
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (Debian package: systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)


def test_systemd_analyze_verify_accepts_the_unit(installable_unit):
    done = _analyze("verify", str(installable_unit))
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def test_security_exposure_stays_low(installable_unit):
    done = _analyze("security", "--offline=true", str(installable_unit))
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_the_unit_sets_an_open_file_limit_the_metrics_cap_fits_in():
    """Without LimitNOFILE a connection flood could take the descriptors cleanup and the state db need; the
    daemon warns when metrics.max_connections is over a quarter of the limit (surfaces/server.py)."""
    (limit,) = re.findall(r"(?m)^LimitNOFILE=(\d+)$", UNIT.read_text())
    from trainguard.config import Metrics

    assert int(limit) >= max(1024, 4 * Metrics().max_connections)  # 1024: systemd's default soft limit
