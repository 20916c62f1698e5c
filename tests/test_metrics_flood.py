"""The whole flood at once, on a TLS port with basic auth, while a real Prometheus scrapes every second with a
1 s timeout: 12 clients streaming after their request head, 300 silent connections, 20 TLS handshakes dripped
a byte a second, 100 wrong passwords. Every scrape of trainguard must succeed within 1 s and the daemon's RSS
grow less than 30 MiB; node_exporter (Debian's, same web config, same flood) is flooded next and its worst
scrape printed beside ours."""

from __future__ import annotations

import ssl
import time
import urllib.parse

import pytest

from bench._reference import start_node_exporter, stop
from tests.support.daemon_proc import REPO, DaemonProcess, wait_until
from tests.support.flood import RssWatch, basic, flooded
from tests.support.prometheus import Prometheus, prometheus_binary
from tests.support.tls import make_pki
from tests.test_exporter import config as daemon_config

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    prometheus_binary() is None, reason="prometheus not installed (Debian package: prometheus; .ci/run installs it)")]

RULES = REPO / "deploy" / "prometheus" / "trainguard.rules.yml"
WINDOW = 12  # seconds of flood per target
MiB = 2**20


def worst(prom: Prometheus, job: str, at: float) -> tuple[int, str, float]:
    """(scrapes, the lowest `up`, the longest scrape) of `job` in the WINDOW before `at`."""
    def one(expr: str) -> str:
        (result,) = prom.api("query?" + urllib.parse.urlencode({"query": expr, "time": at}))["result"]
        return result["value"][1]
    window = f'{{job="{job}"}}[{WINDOW}s]'
    return (int(one(f"count_over_time(up{window})")), one(f"min_over_time(up{window})"),
            float(one(f"max_over_time(scrape_duration_seconds{window})")))


def flood(target: str, pid: int, context: ssl.SSLContext) -> tuple[float, int]:
    """Flood `target` for WINDOW seconds; (when it ended, the RSS growth of `pid` in bytes)."""
    host, port = target.rsplit(":", 1)
    rss = RssWatch(pid)
    rss.start()
    with flooded((host, int(port)), context, "prometheus"):
        time.sleep(WINDOW)
        ended = time.time()
    return ended, rss.stop()


def test_a_flood_of_every_kind_leaves_every_scrape_within_a_second(tmp_path):
    import bcrypt

    pki = make_pki(tmp_path / "pki")
    hashed = bcrypt.hashpw(b"scrape-pass", bcrypt.gensalt(10)).decode()  # htpasswd -nBC 10's cost
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n"
                   f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
    context = ssl.create_default_context(cafile=str(pki.ca))
    node = start_node_exporter(str(web), context, {"Authorization": basic("prometheus", "scrape-pass")})
    cfg = daemon_config(tmp_path / "state", [tmp_path], interval="1s") + f'web_config = "{web}"\n[gpu]\nenabled = false\n'
    scrape = {"scheme": "https", "tls_config": {"ca_file": str(pki.ca)},
              "basic_auth": {"username": "prometheus", "password": "scrape-pass"}}
    try:
        with DaemonProcess(tmp_path, cfg) as daemon:
            ours = urllib.parse.urlparse(daemon.metrics_url(timeout=30)).netloc
            jobs = ({"job_name": "node", "static_configs": [{"targets": [urllib.parse.urlparse(node[1]).netloc]}],
                     **scrape},) if node else ()
            with Prometheus(tmp_path / "prom", [ours], RULES, scrape=scrape, jobs=jobs) as prom:
                wait_until(lambda: prom.query('up{job="trainguard"} == 1'), 30, interval=0.5, what="a first scrape")
                ended, growth = flood(ours, daemon.proc.pid, context)
                if node:
                    node_ended, node_growth = flood(urllib.parse.urlparse(node[1]).netloc, node[0].pid, context)
                time.sleep(1.5)  # the last scrapes are in
                scrapes, lowest_up, longest = worst(prom, "trainguard", ended)
                if node:
                    print(f"\nnode_exporter under the same flood: worst scrape {worst(prom, 'node', node_ended)[2]:.3f} s, "
                          f"RSS +{node_growth / MiB:.1f} MiB")
                print(f"trainguard: worst scrape {longest:.3f} s, RSS +{growth / MiB:.1f} MiB")
    finally:
        if node:
            stop(node[0])
    assert scrapes >= WINDOW - 2, "scrapes went missing"
    assert lowest_up == "1", "a scrape failed or took longer than its 1 s timeout"
    assert longest < 1.0
    assert growth < 30 * MiB, f"RSS grew {growth / MiB:.0f} MiB"
    assert "Traceback" not in daemon.log, daemon.log[-3000:]
