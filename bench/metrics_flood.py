"""Scrapes of the metrics port under a flood of every kind, against node_exporter under the same flood.

    .venv/bin/python bench/metrics_flood.py [--seconds 15]

A real `trainguard run` and Debian's prometheus-node-exporter serve the same web config (TLS, a bcrypt
cost-10 user). Each in turn gets the flood of tests/support/flood.py (12 clients streaming after their
request head, 300 silent connections, 20 TLS handshakes dripped a byte a second, 100 wrong passwords) while
a client keeping its connection, as Prometheus does, scrapes it every 0.25 s with a 2 s timeout; the same
client scrapes it calm first. Printed: median and worst scrape, failed scrapes, RSS growth, the slowdown of
the median under the flood, and the ratios trainguard / node_exporter (the machine is shared and noisy:
the ratio is the figure).
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _reference import start_node_exporter, stop  # noqa: E402

from tests.support.daemon_proc import DaemonProcess  # noqa: E402
from tests.support.flood import RssWatch, Scraper, basic, flooded  # noqa: E402
from tests.support.tls import make_pki  # noqa: E402

MiB = 2**20


def measure(url: str, pid: int, context: ssl.SSLContext, headers: dict, seconds: float) -> dict:
    address = urlparse(url)
    scraper = Scraper(address.hostname, address.port, interval=0.25, timeout=2.0, context=context, headers=headers)
    calm = [scraper.scrape() for _ in range(20)]
    assert None not in calm, f"{url} does not answer"
    rss = RssWatch(pid)
    rss.start()
    with flooded((address.hostname, address.port), context, "prometheus"):
        time.sleep(1.0)
        scraper.start()
        time.sleep(seconds)
        scraper.stop()
    times = [t for t in scraper.times if t is not None]
    return {"scrapes": len(scraper.times), "failed": len(scraper.times) - len(times),
            "median": statistics.median(times) if times else float("nan"), "worst": max(times, default=float("nan")),
            "rss": rss.stop() / MiB, "calm": statistics.median(calm)}


def show(name: str, m: dict) -> None:
    print(f"{name}: {m['scrapes']} scrapes, {m['failed']} failed (over 2 s), median {m['median'] * 1e3:.1f} ms, "
          f"worst {m['worst'] * 1e3:.1f} ms, RSS +{m['rss']:.1f} MiB; calm median {m['calm'] * 1e3:.1f} ms "
          f"(x{m['median'] / m['calm']:.1f} under the flood)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    import bcrypt

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pki = make_pki(work / "pki")
        hashed = bcrypt.hashpw(b"scrape-pass", bcrypt.gensalt(10)).decode()
        web = work / "web.yml"
        web.write_text(f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n"
                       f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
        context = ssl.create_default_context(cafile=str(pki.ca))
        headers = {"Authorization": basic("prometheus", "scrape-pass")}
        cfg = (f'[general]\nstate_dir = "{work / "state"}"\ninterval = "1s"\n[filesystems]\npaths = ["{work}"]\n'
               f'exclude = ["*"]\n[metrics]\nlisten = "127.0.0.1:0"\nweb_config = "{web}"\n[gpu]\nenabled = false\n')
        with DaemonProcess(work, cfg) as daemon:
            ours = measure(daemon.metrics_url(timeout=30), daemon.proc.pid, context, headers, args.seconds)
        show("trainguard", ours)
        node = start_node_exporter(str(web), context, headers)
        if node is None:
            print("node_exporter not installed (Debian package prometheus-node-exporter): no reference ratio")
            return 0
        try:
            ref = measure(node[1], node[0].pid, context, headers, args.seconds)
        finally:
            stop(node[0])
        show("node_exporter", ref)
        print(f"ratio trainguard/node_exporter: median {ours['median'] / ref['median']:.2f}x, "
              f"worst {ours['worst'] / ref['worst']:.2f}x, RSS growth {ours['rss'] / max(ref['rss'], 0.1):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
