"""Attacks on the metrics port over real sockets, while a real daemon cycles and cleans up under the
open-file limit of a service (1024) and a real Prometheus scrapes it every second with a 1 s timeout:
2,000 silent connections, and 50 clients dripping a request a byte at a time (both reconnecting as soon
as the server drops them). Every scrape must be answered within 1 s, the cycle keep its pace, a cleanup
run delete what it should, and the daemon's file descriptors stay bounded; every connection the daemon
accepts during the attack is gone within the head deadline (watched in /proc/PID/fd)."""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from trainguard.surfaces.httpserver import HEAD_DEADLINE

from tests.support.daemon_proc import REPO, DaemonProcess, wait_until
from tests.support.flood import Attackers
from tests.support.prometheus import Prometheus, prometheus_binary

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    prometheus_binary() is None, reason="prometheus not installed (Debian package: prometheus; .ci/run installs it)")]

RULES = REPO / "deploy" / "prometheus" / "trainguard.rules.yml"
ATTACK_S = 15
SERVICE_NOFILE = 1024  # systemd's default soft limit for a service
MAX_CONNECTIONS = 16  # the default


def raise_own_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the attack needs {needed} open files; the hard limit here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class FdWatch(threading.Thread):
    """Polls /proc/PID/fd: the most descriptors open at once, and how long each socket that appears is held."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.stopping = threading.Event()
        self.baseline = self.sockets()  # fd -> what it is, before the attack
        self.most = 0  # sockets open at once that were not open before the attack
        self.most_other = 0  # other descriptors at once beyond the baseline (cleanup's walk, /proc reads)
        self.at_most_other: list[str] = []
        self.at_most: list[str] = []  # what was open at the busiest moment, for the message
        self.first_seen: dict[str, float] = {}
        self.held: dict[str, float] = {}  # socket -> seconds it was open, for sockets opened while watched
        self.what: dict[str, str] = {}  # socket -> its line in /proc/PID/net/tcp (which ports)

    def sockets(self) -> dict[str, str]:
        out = {}
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except OSError:
                continue
            out[fd] = target
        return out

    def run(self) -> None:
        baseline = {t for t in self.baseline.values() if t.startswith("socket:")}
        while not self.stopping.wait(0.1):
            now = time.monotonic()
            fds = self.sockets()
            open_now = {t for t in fds.values() if t.startswith("socket:")} - baseline
            if len(open_now) > self.most:
                self.most, self.at_most = len(open_now), sorted(fds.values())
            other = sum(not t.startswith("socket:") for t in fds.values()) \
                - sum(not t.startswith("socket:") for t in self.baseline.values())
            if other > self.most_other:
                self.most_other, self.at_most_other = other, sorted(set(fds.values()) - set(self.baseline.values()))
            for sock in open_now:
                if sock not in self.first_seen:
                    self.first_seen[sock] = now
                    self.what[sock] = _tcp_entry(self.pid, sock)
            for sock, seen in self.first_seen.items():
                self.held[sock] = now - seen if sock in open_now else self.held.get(sock, now - seen)


def _tcp_entry(pid: int, sock: str) -> str:
    inode = sock.removeprefix("socket:[").rstrip("]")
    for table in ("tcp", "tcp6", "unix"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh:
                if f" {inode} " in line:
                    return f"{table}: {' '.join(line.split()[:4])}"
    return "?"


def daemon_argv(config: Path) -> list[str]:
    """`trainguard run` under a service's open-file limit."""
    code = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({SERVICE_NOFILE}, "
            f"{SERVICE_NOFILE})); sys.argv = ['trainguard', 'run', '--config', {str(config)!r}]; "
            "runpy.run_module('trainguard', run_name='__main__')")
    return [sys.executable, "-c", code]


def old_files(root: Path, dirs: int = 40, each: int = 5) -> list[Path]:
    """A month-old files in their own directories, filling the 8 MiB tmpfs to ~70 %: over the cleanup
    policy's high watermark, so the daemon's next cycle starts a cleanup run that deletes them."""
    made = []
    for d in range(dirs):
        (root / f"run{d}").mkdir(parents=True, exist_ok=True)
        for n in range(each):
            path = root / f"run{d}" / f"events.{n}"
            path.write_bytes(b"x" * 28 * 1024)
            os.utime(path, (time.time() - 30 * 86400,) * 2)
            made.append(path)
    return made


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [8 * 2**20], indirect=True)
@pytest.mark.parametrize("attack", ["2000-idle", "50-slow-drip"])
def test_an_attack_on_the_metrics_port_leaves_scrapes_cycles_and_cleanup_alone(tmp_path, tmpfs_mount, attack):
    raise_own_fd_limit(4096)
    scratch = tmpfs_mount / "scratch"
    scratch.mkdir()
    cfg = (f'[general]\nstate_dir = "{tmp_path / "state"}"\ninterval = "0.5s"\n[filesystems]\n'
           f'paths = ["{tmpfs_mount}"]\nexclude = ["*"]\n[metrics]\nlisten = "127.0.0.1:0"\n[gpu]\nenabled = false\n'
           f'[[cleanup]]\nname = "scratch"\ntype = "age"\nroots = ["{scratch}"]\nolder_than = "7d"\nage_by = ["mtime"]\n'
           'grace = "0s"\nwatermark = true\nhigh = "50%"\nlow = "1%"\n')
    (tmp_path / "config.toml").write_text(cfg)
    with DaemonProcess(tmp_path, cfg, argv=daemon_argv(tmp_path / "config.toml")) as daemon:
        address = urlparse(daemon.metrics_url(timeout=30)).netloc
        with Prometheus(tmp_path / "prom", [address], RULES) as prom:
            wait_until(lambda: [r for r in prom.query('up{job="trainguard"} == 1')], 30, interval=0.5,
                       what="Prometheus scraping trainguard")
            time.sleep(3)  # its connection is made and kept
            watch = FdWatch(daemon.proc.pid)
            host, port = address.rsplit(":", 1)
            attackers = (Attackers((host, int(port)), 2000) if attack == "2000-idle"
                         else Attackers((host, int(port)), 50, drip=0.5))
            watch.start()
            attackers.start()
            started = time.monotonic()
            try:
                time.sleep(3)
                files = old_files(scratch)  # cleanup's next scheduled run must find and delete them
                # It deletes oldest-first down to the low watermark (1 %): all but a file or two.
                wait_until(lambda: sum(p.exists() for p in files) <= 3 and "cleanup scratch (watermark) freed"
                           in daemon.log, ATTACK_S - 3, interval=0.2, what="the cleanup run during the attack")
                time.sleep(max(0.0, started + ATTACK_S - time.monotonic()))
            finally:
                attackers.stopping.set()
                attackers.join(10)
                watch.stopping.set()
                watch.join(5)
            window = f"{ATTACK_S}s"
            (scrapes,) = prom.query(f'count_over_time(up{{job="trainguard"}}[{window}])')
            (worst_up,) = prom.query(f'min_over_time(up{{job="trainguard"}}[{window}])')
            (slowest,) = prom.query(f'max_over_time(scrape_duration_seconds{{job="trainguard"}}[{window}])')
            (cycles,) = prom.query(f'changes(trainguard_last_cycle_timestamp_seconds{{job="trainguard"}}[{window}])')
            (longest_cycle,) = prom.query(f'max_over_time(trainguard_cycle_duration_seconds[{window}])')
    log = daemon.log
    assert int(scrapes["value"][1]) >= ATTACK_S - 2, "scrapes went missing"
    assert worst_up["value"][1] == "1", "a scrape failed or took longer than its 1 s timeout"
    assert float(slowest["value"][1]) < 1.0
    assert int(float(cycles["value"][1])) >= ATTACK_S - 3, "the daemon's cycle lost its pace"
    assert float(longest_cycle["value"][1]) < 0.5
    assert "Too many open files" not in log and "cycle failed" not in log and "Traceback" not in log, log[-3000:]
    # The bound is the server's: Prometheus' connection (replaced or not) and the attackers' together hold at
    # most max_connections sockets. The rest of the daemon (cleanup's walk, the cycle's /proc and state reads)
    # opens files as it goes, whatever the flood; a descriptor kept per connection would be thousands here.
    assert watch.most <= MAX_CONNECTIONS, f"{watch.most} new sockets open at once: {watch.at_most}"
    assert watch.most_other <= 64, f"{watch.most_other} other descriptors beyond the baseline: {watch.at_most_other}"
    longest = max(watch.held, key=watch.held.get, default=None)
    assert longest is None or watch.held[longest] < HEAD_DEADLINE + 1.0, \
        f"a connection was held {watch.held[longest]:.1f}s: {watch.what[longest]}"
    assert attackers.dropped > 0, "the attack never reached the server"
