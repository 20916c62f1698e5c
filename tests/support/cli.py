"""Run the real `trainguard` command as a child process, from this checkout's sources."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DAEMON_SRC = Path(__file__).resolve().parents[2] / "daemon"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment minus any TRAINGUARD_* the developer has set, with this checkout's package first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(DAEMON_SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def trainguard(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          env=env or cli_env(), timeout=timeout, stdin=subprocess.DEVNULL)


class Daemon:
    """`trainguard run` in the background; its stderr lines are collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "trainguard", "run", *args], env=env or cli_env(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def stderr(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 20.0, after: int = 0) -> re.Match:
        """The first stderr line (from index `after`) matching `pattern`; AssertionError after timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[after:]:
                    if m := regex.search(line):
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no stderr line matching {pattern!r} within {timeout}s "
                                         f"(exit {self.proc.poll()}):\n" + "\n".join(self.lines[-40:]))
                self._cond.wait(min(left, 0.2))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
