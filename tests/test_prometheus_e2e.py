"""The shipped rules in a real Prometheus, scraping a real `trainguard run` on loopback.

Only the `for:` durations are shortened (to 3 s, with 1 s scrape and evaluation intervals);
thresholds, expressions and annotation templates are the shipped ones. NVML is the
scripted fake; the filesystem is a real loop-mounted ext4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from urllib.parse import urlencode, urlparse

import pytest

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec
from tests.support.daemon_proc import REPO, DaemonProcess, wait_until
from tests.support.mounts import fill
from tests.support.prometheus import Prometheus, prometheus_binary
from tests.support.tls import make_pki, write_web_config
from tests.test_exporter import config

RULES = REPO / "deploy" / "prometheus" / "trainguard.rules.yml"

pytestmark = pytest.mark.skipif(prometheus_binary() is None,
                                reason="prometheus not installed (Debian package: prometheus; .ci/run installs it)")


def daemon_config(state_dir, paths, gpu: str) -> str:
    return config(state_dir, paths, interval="0.5s") + f"[gpu]\n{gpu}\n"


def target(daemon: DaemonProcess) -> str:
    return urlparse(daemon.metrics_url(timeout=30)).netloc


def fill_to(mountpoint, ratio: float) -> None:
    """Write one file until used / (used + avail) reaches `ratio`, like the daemon computes it."""
    st = os.statvfs(mountpoint)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    fill(mountpoint / "checkpoint-900.pt", int(ratio * (used + avail)) - used)


@pytest.mark.root
@pytest.mark.parametrize("ext4_mount", [64 * 2**20], indirect=True)
def test_a_filling_disk_goes_pending_then_firing_and_resolves_after_cleanup(tmp_path, ext4_mount):
    fill_to(ext4_mount, 0.5)
    cfg = daemon_config(tmp_path / "state", [ext4_mount], "enabled = false")
    with DaemonProcess(tmp_path, cfg) as daemon, \
            Prometheus(tmp_path / "prom", [target(daemon)], RULES) as prom:
        prom.wait_alert("TrainguardDown", None, timeout=30)  # scraped
        assert not prom.alerts("TrainguardFilesystemAlmostFull")
        fill_to(ext4_mount, 0.95)
        mp = str(ext4_mount)
        pending = prom.wait_alert("TrainguardFilesystemAlmostFull", "pending", mountpoint=mp)
        firing = prom.wait_alert("TrainguardFilesystemAlmostFull", "firing", mountpoint=mp)
        assert firing["labels"]["severity"] == "critical" and firing["labels"]["fstype"] == "ext4"
        assert firing["activeAt"] == pending["activeAt"]
        assert firing["annotations"]["runbook_url"].endswith("/docs/runbooks/TrainguardFilesystemAlmostFull.md")
        # The description's query template ran against the live TSDB: it names the space left.
        assert "MiB left" in firing["annotations"]["description"] or "KiB left" in firing["annotations"]["description"]
        (ext4_mount / "checkpoint-900.pt").unlink()  # the cleanup
        prom.wait_alert("TrainguardFilesystemAlmostFull", None, mountpoint=mp)
        assert not prom.alerts("TrainguardFilesystemFilling")  # freed to ~50 %: no warning either
        # Every dashboard query parses and runs in this Prometheus (a typo would be a 400).
        dashboard = json.loads((REPO / "deploy" / "grafana" / "trainguard.json").read_text())
        for p in dashboard["panels"]:
            for t in p.get("targets", ()):
                prom.api("query?" + urlencode({"query": t["expr"].replace("$instance", ".*")}))


def test_a_gpu_stall_goes_pending_then_firing_and_resolves_when_work_resumes(tmp_path):
    heartbeat = tmp_path / "heartbeat"  # the fake reports the GPU busy while this file is fresh
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        script = {"gpus": [gpu_spec([{"at": 0, "mem_used": 76 * GiB,
                                      "processes": [{"pid": holder.pid, "used": 76 * GiB}]}],
                                    heartbeat={"path": str(heartbeat), "fresh_s": 2, "busy": 97, "idle": 0}),
                           gpu_spec([{"at": 0, "util": 90, "mem_used": 10 * GiB}])]}
        (tmp_path / "nvml.json").write_text(json.dumps(script))
        env = {"PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO / "daemon"), str(REPO)]),
               "TRAINGUARD_FAKE_NVML": str(tmp_path / "nvml.json")}
        cfg = daemon_config(tmp_path / "state", [tmp_path], 'for = "2s"\npy_spy = false')
        with DaemonProcess(tmp_path, cfg, env=env) as daemon, \
                Prometheus(tmp_path / "prom", [target(daemon)], RULES) as prom:
            pending = prom.wait_alert("TrainguardGpuStalled", "pending", gpu="0")
            firing = prom.wait_alert("TrainguardGpuStalled", "firing", gpu="0")
            assert firing["activeAt"] == pending["activeAt"]
            assert firing["labels"]["uuid"].startswith("GPU-") and firing["labels"]["severity"] == "critical"
            assert "trainguard diagnose 0" in firing["annotations"]["description"]
            assert {a["labels"]["gpu"] for a in prom.alerts("TrainguardGpuStalled")} == {"0"}  # GPU 1 works
            deadline = time.monotonic() + 60
            while prom.alerts("TrainguardGpuStalled") and time.monotonic() < deadline:
                heartbeat.touch()  # the job computes again
                time.sleep(0.5)
            assert not prom.alerts("TrainguardGpuStalled"), "the stall alert did not resolve"
    finally:
        holder.kill()
        holder.wait()


def test_prometheus_scrapes_over_tls_with_a_client_certificate_and_basic_auth(tmp_path):
    """The web config node_exporter would take, and Prometheus' tls_config and basic_auth beside it: the right
    client is served the series; a wrong password (401) and a missing client certificate are refused."""
    pki = make_pki(tmp_path / "pki")
    web = write_web_config(tmp_path / "web.yml", pki, {"prometheus": "scrape-pass"},
                           http_server_config={"headers": {"X-Content-Type-Options": "nosniff"}})
    cfg = config(tmp_path / "state", [tmp_path], interval="0.5s") + f'web_config = "{web}"\n[gpu]\nenabled = false\n'
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    right = {"scheme": "https", "tls_config": tls, "basic_auth": {"username": "prometheus", "password": "scrape-pass"}}
    with DaemonProcess(tmp_path, cfg) as daemon:
        url = daemon.metrics_url(timeout=30)
        assert url.startswith("https://127.0.0.1:")
        address = urlparse(url).netloc
        jobs = ({"job_name": "wrong-password", "static_configs": [{"targets": [address]}],
                 **right, "basic_auth": {"username": "prometheus", "password": "guess"}},
                {"job_name": "no-client-cert", "static_configs": [{"targets": [address]}],
                 **right, "tls_config": {"ca_file": str(pki.ca)}})
        with Prometheus(tmp_path / "prom", [address], RULES, scrape=right, jobs=jobs) as prom:
            def scraped():
                ups = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
                return len(ups) == 3 and ups
            ups = wait_until(scraped, 30, interval=0.5, what="three scrape jobs with a result")
            assert ups == {"trainguard": "1", "wrong-password": "0", "no-client-cert": "0"}
            series = prom.query('trainguard_filesystem_size_bytes{job="trainguard"}')
            assert len(series) == 1 and float(series[0]["value"][1]) > 0  # the one watched mount's size
            errors = {t["labels"]["job"]: t["lastError"] for t in prom.api("targets")["activeTargets"]}
            assert errors["trainguard"] == "" and "401" in errors["wrong-password"]
            assert "tls" in errors["no-client-cert"].lower() or "certificate" in errors["no-client-cert"].lower()
    assert "scrape-pass" not in daemon.log
