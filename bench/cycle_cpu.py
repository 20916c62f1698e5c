"""CPU of the daemon with 30 mounts and 8 GPUs, against node_exporter's, measured in the same run.

    sudo PYTHONPATH=daemon:. python bench/cycle_cpu.py [--mounts 30] [--gpus 8] [--rounds 7] [--slots 16]

The daemon is built in this process (as bench/storage_cycle.py does) with its default configuration
(10 s interval, /metrics served on a loopback port) over real tmpfs mounts with 6 h of history each,
so every cycle fits a full forecast window, and 8 GPUs of the NVML fake with 4 processes each; the
fake is Python, so its calls count against trainguard (an upper bound). The reference is Debian's
node_exporter on this host, default collectors.

Per cycle: the daemon's process CPU over `--cycles` cycles run back to back, the clock stepped 10 s
per cycle so history grows as at the default interval, against node_exporter's CPU per /metrics
scrape (from /proc/<pid>/stat over `--scrapes` scrapes). Rounds alternate between the two, so both
see the same load on a shared machine; the figures are medians over the rounds.

Per second of running time, as a user sees them side by side (the target): the daemon runs its own
loop (`Daemon.run`, real time, its default interval) for `--slots` slots of `--scrape-every` seconds
(15 s), and in each slot both node_exporter's and trainguard's /metrics are scraped once, as Prometheus
scrapes (one connection kept open to each, gzip asked for; `--fresh-connections`: a new connection and
plain text each time, as the README's earlier rows were measured). Each side's
CPU over the same wall time, its idle work between cycles or scrapes included: node_exporter's from
/proc/<pid>/stat, the daemon's as this process's CPU less the benchmark's own thread (the scrapes).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(REPO, "daemon"), REPO, os.path.dirname(os.path.abspath(__file__))]

from _daemon import Quiet, SteppedClock  # noqa: E402
from _reference import cpu_precise, cpu_seconds, free_port, start_node_exporter, stop  # noqa: E402
from trainguard import config as configmod  # noqa: E402
from trainguard.service.daemon import Daemon  # noqa: E402

from tests.gpu_support import GiB, fake_pynvml, gpu_spec  # noqa: E402
from tests.support.mounts import tmpfs  # noqa: E402


def web_setup(tmp: str) -> tuple[str, ssl.SSLContext, dict]:
    """(web.yml, a client context trusting its CA, the Authorization header): TLS and one bcrypt user."""
    import bcrypt

    from tests.support.tls import make_pki

    pki = make_pki(Path(tmp) / "pki")
    hashed = bcrypt.hashpw(b"bench-pass", bcrypt.gensalt(10)).decode()  # exporter-toolkit's documented cost
    path = Path(tmp) / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
                    f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    header = {"Authorization": "Basic " + base64.b64encode(b"prometheus:bench-pass").decode()}
    return str(path), ssl.create_default_context(cafile=str(pki.ca)), header


def build(points: list[str], gpus: int, state: str, web_config: str = "") -> Daemon:
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:4 * gpus]
    specs = [gpu_spec([{"at": 0, "util": 90, "mem_used": 60 * GiB, "temperature": 60, "power_w": 400,
                        "processes": [{"pid": pid, "used": GiB} for pid in pids[i::gpus]]}]) for i in range(gpus)]
    nvml = fake_pynvml.FakeNvml({"gpus": specs})
    cfg = configmod.parse({"filesystems": {"exclude": ["*"], "paths": points}, "gpu": {"py_spy": False},
                           "metrics": {"listen": f"127.0.0.1:{free_port()}", "web_config": web_config}}, "bench")
    web = configmod.read_web_config(web_config) if web_config else None
    clock = SteppedClock()
    d = Daemon(configmod.Loaded(cfg, "bench", web=web), clock=clock, state_dir=state, notifiers=[Quiet()], nvml=nvml)
    now, size = clock.time(), 4 * 2**20
    for k in range(6 * 360, 0, -1):  # six hours at 10 s for every mount
        d.history.record(now - 10 * k, {f"fs.avail_bytes:{p}": size - 100 * (6 * 360 - k) for p in points})
    d.cycle()  # warm: threads, NVML start, first diskstats reading
    return d


def cycle_cpu(d: Daemon, cycles: int) -> float:
    c0 = time.process_time()
    for _ in range(cycles):
        d.clock.offset += 10.0
        d.cycle()
    return (time.process_time() - c0) / cycles


# What Prometheus sends: with gzip, each exporter also compresses its answer.
PROMETHEUS_HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "gzip"}


class Scraper:
    """GETs one /metrics URL as Prometheus does: one connection kept open between scrapes, gzip asked
    for. `fresh`: a new connection and plain text every time (how the README's earlier rows scraped)."""

    def __init__(self, url: str, fresh: bool = False, context: ssl.SSLContext | None = None,
                 headers: dict | None = None):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.path, self.fresh = parts.hostname, parts.port, parts.path, fresh
        self.context, self.headers = (context, headers or {}) if parts.scheme == "https" else (None, {})
        self.conn: http.client.HTTPConnection | None = None

    def get(self) -> None:
        if self.conn is None or self.fresh:
            self.conn = (http.client.HTTPSConnection(self.host, self.port, timeout=10, context=self.context)
                         if self.context else http.client.HTTPConnection(self.host, self.port, timeout=10))
        self.conn.request("GET", self.path, headers={**({} if self.fresh else PROMETHEUS_HEADERS), **self.headers})
        answer = self.conn.getresponse()
        answer.read()
        if self.fresh:
            self.conn.close()
        if answer.status != 200:
            raise RuntimeError(f"{self.host}:{self.port}{self.path} answered {answer.status}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def scrape_cpu(pid: int, scraper: Scraper, scrapes: int) -> float:
    c0 = cpu_seconds(pid)
    for _ in range(scrapes):
        scraper.get()
    return (cpu_seconds(pid) - c0) / scrapes


def real_time(d: Daemon, node: tuple, slots: int, every: float, *, scrape_ours: bool = True,
              fresh: bool = False, web: tuple | None = None) -> tuple[float, float, int]:
    """(daemon CPU per second, node_exporter CPU per second, cycles run) over `slots` real slots, the
    daemon running its own loop; node_exporter's /metrics (and the daemon's, with scrape_ours) are
    scraped once per slot."""
    ours = f"{'https' if web else 'http'}://127.0.0.1:{d.config.metrics.address[1]}/metrics"
    context, headers = (web[1], web[2]) if web else (None, None)
    scrapers = [Scraper(url, fresh, context, headers) for url in ([node[1], ours] if scrape_ours else [node[1]])]
    cycles = [0]
    cycle = d.cycle

    def counted():
        cycles[0] += 1
        return cycle()

    d.cycle = counted
    loop = threading.Thread(target=d.run, name="daemon", daemon=True)
    loop.start()
    time.sleep(2.0)  # its first cycle and the metrics port
    if web:  # as Prometheus' kept connection is: handshake done, password checked (bcrypt cached) on both
        for scraper in scrapers:
            scraper.get()
    c0, m0, n0, w0 = time.process_time(), time.thread_time(), cpu_precise(node[0].pid), time.monotonic()
    for k in range(slots):
        for scraper in scrapers:
            scraper.get()
        time.sleep(max(w0 + (k + 1) * every - time.monotonic(), 0.0))
    wall = time.monotonic() - w0
    mine = (time.process_time() - c0) - (time.thread_time() - m0)
    n1 = cpu_precise(node[0].pid)
    node_cpu, ticks = n1[0] - n0[0], n1[1] - n0[1]
    if abs(node_cpu - ticks) > 0.02:  # a thread ended (its run time left the sum): the coarse figure
        print(f"  node_exporter: thread run times {node_cpu * 1e3:.0f} ms, process {ticks * 1e3:.0f} ms; "
              "using the process's", file=sys.stderr)
        node_cpu = ticks
    for scraper in scrapers:
        scraper.close()
    d.stop_event.set()
    loop.join(30)
    return mine / wall, node_cpu / wall, cycles[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mounts", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cycles", type=int, default=20, help="daemon cycles per round")
    ap.add_argument("--scrapes", type=int, default=20, help="node_exporter scrapes per round")
    ap.add_argument("--scrape-every", type=float, default=15.0, help="seconds between scrapes (per-second figure)")
    ap.add_argument("--slots", type=int, default=16, help="real scrape intervals the per-second figure is taken over")
    ap.add_argument("--no-scrape-ours", action="store_true", help="serve the daemon's /metrics but scrape nobody's")
    ap.add_argument("--fresh-connections", action="store_true",
                    help="a new connection and plain text per scrape, not Prometheus's kept connection and gzip")
    ap.add_argument("--tls-auth", action="store_true",
                    help="both ports behind the same web config: TLS and a bcrypt basic-auth user")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root: it mounts tmpfs filesystems", file=sys.stderr)
        return 2
    ours, theirs = [], []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        web = web_setup(tmp) if args.tls_auth else None
        ref = start_node_exporter(*web) if web else start_node_exporter()
        if ref is None:
            print("node_exporter not installed (Debian package prometheus-node-exporter): no reference",
                  file=sys.stderr)
            return 2
        stack.callback(stop, ref[0])
        points = [str(stack.enter_context(tmpfs(4 * 2**20))) for _ in range(args.mounts)]
        d = build(points, args.gpus, os.path.join(tmp, "state"), web[0] if web else "")
        stack.callback(d.close)  # again after run() closed it: closing twice is harmless
        node_scraper = Scraper(ref[1], args.fresh_connections, *(web[1:] if web else ()))
        stack.callback(node_scraper.close)
        scrape_cpu(ref[0].pid, node_scraper, 3)  # warm
        for _ in range(args.rounds):
            ours.append(cycle_cpu(d, args.cycles))
            theirs.append(scrape_cpu(ref[0].pid, node_scraper, args.scrapes))
        interval = d.cycle_interval()
        mine_per_s, node_per_s, ran = real_time(d, ref, args.slots, args.scrape_every,  # run() closes it
                                                scrape_ours=not args.no_scrape_ours,
                                                fresh=args.fresh_connections, web=web)
    mine, node = statistics.median(ours), statistics.median(theirs)
    print(f"{args.mounts} tmpfs mounts + {args.gpus} GPUs (NVML fake), {args.rounds} rounds of {args.cycles} cycles "
          f"/ {args.scrapes} scrapes, medians")
    print(f"  trainguard CPU per cycle       : {mine * 1e3:7.2f} ms  (rounds: "
          f"{', '.join(f'{x * 1e3:.1f}' for x in ours)})")
    print(f"  node_exporter CPU per scrape   : {node * 1e3:7.2f} ms  (rounds: "
          f"{', '.join(f'{x * 1e3:.1f}' for x in theirs)})")
    print(f"  ratio cycle / scrape           : {mine / node:7.2f}x")
    print(f"  per cycle / {interval:.0f} s interval      : {mine / interval * 1e3:7.3f} ms/s  (cycles only)")
    scraped = "node_exporter's /metrics" if args.no_scrape_ours else "both /metrics"
    print(f"  real time, {args.slots} slots of {args.scrape_every:.0f} s, {scraped} scraped once a slot"
          f"{' (new connection, plain)' if args.fresh_connections else ' (kept connection, gzip)'}"
          f"{', TLS + basic auth on both' if args.tls_auth else ''}, idle work included:")
    print(f"  trainguard CPU per second      : {mine_per_s * 1e3:7.3f} ms  ({ran} cycles at its {interval:.0f} s interval)")
    print(f"  node_exporter CPU per second   : {node_per_s * 1e3:7.3f} ms")
    print(f"  ratio per second               : {mine_per_s / node_per_s:7.2f}x (target <= 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
