"""Debian's prometheus-node-exporter as the reference a user compares trainguard with."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

CANDIDATES = ("prometheus-node-exporter", "node_exporter")
# Its default exclusions, and FUSE: a hung FUSE mount elsewhere on a shared host (a test's slow
# filesystem) would stall every scrape, and the reference would measure the hang, not the exporter.
FS_TYPES_EXCLUDE = ("^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|"
                    "mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|sysfs|tracefs|"
                    "fuse\\..*)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node_exporter(web_config: str | None = None, context=None,
                        headers: dict | None = None) -> tuple[subprocess.Popen, str] | None:
    """node_exporter on a free loopback port; with `web_config` (its --web.config.file) it is probed over
    https with `context` and `headers` (basic auth)."""
    exe = next((shutil.which(c) for c in CANDIDATES if shutil.which(c)), None)
    if exe is None:
        return None
    port = free_port()
    web = [f"--web.config.file={web_config}"] if web_config else []
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}",
                             f"--collector.filesystem.fs-types-exclude={FS_TYPES_EXCLUDE}", *web],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"{'https' if web_config else 'http'}://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2,
                                   context=context).read()
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
    """utime + stime of the whole process, dead threads included; shown in clock ticks (10 ms)."""
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_precise(pid: int) -> tuple[float, float]:
    """(CPU seconds to the nanosecond, cpu_seconds) of a process: the first sums its live threads'
    schedstat run time. node_exporter spends ~70 ms in two minutes, so the 10 ms ticks of
    /proc/PID/stat alone would make its per-second figure +-14 %; a thread that ended in between
    loses its time from the first, which the caller sees against the second."""
    import glob

    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9, cpu_seconds(pid)
