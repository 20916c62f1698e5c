"""Debian's prometheus-node-exporter as the reference a user compares trainguard with."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

CANDIDATES = ("prometheus-node-exporter", "node_exporter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node_exporter() -> tuple[subprocess.Popen, str] | None:
    exe = next((shutil.which(c) for c in CANDIDATES if shutil.which(c)), None)
    if exe is None:
        return None
    port = free_port()
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    return None


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
