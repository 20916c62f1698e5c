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

from tests.support.daemon_proc import REPO

UNIT = REPO / "systemd" / "trainguard.service"
RULES = REPO / "deploy" / "prometheus" / "trainguard.rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "trainguard.rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "trainguard.json"
MAX_EXPOSURE = 3.5  # systemd-analyze security score; README records the current figure


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
    stall = Finding("gpu.stall:0", Severity.CRITICAL, "x", details={"stalled_for_s": 1.0}, labels={"gpu": "0"})
    checkpoint = Finding("fs.next_checkpoint:/data", Severity.CRITICAL, "x")
    r = Readings(snap, 1.0, 0.1, fill_eta={"/data": 10.0}, findings=(stall, checkpoint), cleanup_freed={"p": 1},
                 notify_failures={"t": 1})
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
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert referenced(exprs) - names == set()
    # Recording rules the dashboard reads must be defined in the rules file.
    records = {r["record"] for g in yaml.safe_load(rules_text)["groups"] for r in g["rules"] if "record" in r}
    assert set(re.findall(r"\btrainguard:[a-z_:]+\b", exprs)) <= records


def test_every_detector_has_a_fleet_rule():
    names = alerts()
    for name in ("TrainguardFilesystemAlmostFull", "TrainguardFilesystemFilling", "TrainguardInodesAlmostExhausted",
                 "TrainguardFilesystemFullSoon", "TrainguardFilesystemFullWithin6h", "TrainguardMountUnresponsive",
                 "TrainguardDiskSaturated", "TrainguardGpuStalled", "TrainguardGpuXidCritical",
                 "TrainguardGpuThrottled", "TrainguardMirrorLagging", "TrainguardCheckpointWillNotFit"):
        assert name in names


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
