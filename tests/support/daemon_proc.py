"""A real `trainguard run` child process for service-level tests.

``DaemonProcess`` writes a config, starts ``python -m trainguard run`` with this
checkout's package first on sys.path, collects its stderr in a file, and always
stops it (SIGTERM, then SIGKILL by PID) on the way out.  ``metrics_url`` is read
from the daemon's own log line, so tests can use port 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"serving metrics on (https?://\S+/metrics)")


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll predicate until it returns a truthy value; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "daemon"), str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class DaemonProcess:
    def __init__(self, workdir: Path, config_text: str, env: Mapping[str, str] | None = None,
                 argv: list[str] | None = None):
        self.workdir = workdir
        self.config_path = workdir / "config.toml"
        self.config_path.write_text(config_text)
        self.log_path = workdir / "daemon.log"
        self.env = child_env(env)
        self.argv = argv or [sys.executable, "-m", "trainguard", "run", "--config", str(self.config_path)]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "DaemonProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir)
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match:
        rx = re.compile(pattern)

        def found():
            self._check_alive()
            return rx.search(self.log)
        return wait_until(found, timeout, what=f"log line /{pattern}/ in:\n{self.log}")

    def metrics_url(self, timeout: float = 10.0) -> str:
        return self.wait_log(_SERVING.pattern, timeout).group(1)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log}")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "DaemonProcess":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
