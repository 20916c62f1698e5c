"""Run real processes for the field scenarios: the ``trainguard run`` daemon and the trainers.

Every process is started by this module, remembered by PID and ended by PID at
the end (SIGTERM, then SIGKILL after a bounded wait), even when the test fails.
Waiting is always "poll a condition until a deadline", never a blind sleep::

    with Processes(tmp_path) as procs:
        daemon = procs.trainguard(config_text, name="tg")
        trainer = procs.python(TRAINER, "--epochs", "20", ..., name="trainer")
        daemon.wait_log(r"forecast", timeout=30)
        assert trainer.wait(timeout=60) == 0
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO / "daemon"
HERE = Path(__file__).resolve().parent
TRAINER = HERE / "trainer.py"
TB_TRAINER = HERE / "tb_trainer.py"
FAKE_NVML_DIR = REPO / "tests" / "fake_nvml"

T = TypeVar("T")

_STOP_WAIT_S = 5.0


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
               abort: Callable[[], str | None] | None = None) -> T:
    """Poll ``condition`` until it returns something truthy; return it.

    Raises TimeoutError naming ``what`` after ``timeout`` seconds, or
    RuntimeError at once when ``abort`` returns a reason (a process died).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if abort is not None and (reason := abort()):
            raise RuntimeError(f"while waiting for {what}: {reason}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)


class Child:
    """One started process; its stdout+stderr go to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str],
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def died(self) -> str | None:
        """A reason when the process has exited (for ``wait_until(abort=...)``)."""
        if self.proc.poll() is None:
            return None
        return f"{self.name} (pid {self.pid}) exited {self.proc.returncode}; output tail:\n{self.output()[-3000:]}"

    def wait_log(self, pattern: str, timeout: float, after: int = 0) -> re.Match[str]:
        """Wait until the output (from character ``after`` on) matches the regex ``pattern``."""
        regex = re.compile(pattern, re.MULTILINE)

        def found() -> re.Match[str] | None:
            return regex.search(self.output(), after)

        try:
            return wait_until(found, timeout, f"{self.name} output matching {pattern!r}", abort=self.died)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; output tail:\n{self.output()[-3000:]}") from None

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        """Wait for exit and return the status; TimeoutError (process left running) otherwise."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} (pid {self.pid}) still running after {timeout:g}s; output tail:\n"
                               f"{self.output()[-3000:]}") from None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within a few seconds; always reaps."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(_STOP_WAIT_S)
        if not self._log.closed:
            self._log.close()
        return self.proc.poll()


class Trainguard(Child):
    """A real ``trainguard run`` (``python -m trainguard``) with its own config file and state directory."""

    def __init__(self, name: str, config_path: Path, state_dir: Path, log_path: Path, env: dict[str, str],
                 extra_args: Sequence[str] = ()) -> None:
        self.config_path = config_path
        self.state_dir = state_dir
        argv = [sys.executable, "-m", "trainguard", "run", "--config", str(config_path), "--state-dir", str(state_dir),
                *extra_args]
        super().__init__(name, argv, log_path, env)

    def write_config(self, text: str) -> None:
        """Replace the config file atomically (a reload must never read half a file)."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    def reload(self) -> None:
        self.signal(signal.SIGHUP)


class Processes:
    """Starts children under ``workdir`` and ends every one of them on exit, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def env(self, extra: dict[str, str] | None = None, fake_nvml: Path | None = None) -> dict[str, str]:
        """The environment for a child: this checkout's package first on the path, no stray config."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        paths = [str(PACKAGE_ROOT), str(REPO)]
        if fake_nvml is not None:
            paths.insert(0, str(FAKE_NVML_DIR))  # `import pynvml` finds the scripted fake
            env["TRAINGUARD_FAKE_NVML"] = str(fake_nvml)
        env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def python(self, script: Path, *args: str, name: str, env: dict[str, str] | None = None) -> Child:
        child = Child(name, [sys.executable, str(script), *args], self.workdir / f"{name}.log",
                      env if env is not None else self.env())
        self.children.append(child)
        return child

    def trainguard(self, config_text: str, *, name: str = "trainguard", state_dir: Path | None = None,
                   config_path: Path | None = None, env: dict[str, str] | None = None,
                   extra_args: Sequence[str] = ()) -> Trainguard:
        """Write the config and start ``trainguard run``; a restart passes the same state_dir/config_path."""
        config_path = config_path or self.workdir / f"{name}.toml"
        state_dir = state_dir or self.workdir / f"{name}-state"
        if config_text:
            config_path.write_text(config_text)
        daemon = Trainguard(name, config_path, state_dir, self.workdir / f"{name}.log",
                            env if env is not None else self.env(), extra_args)
        self.children.append(daemon)
        return daemon

    def stop_all(self) -> None:
        for child in reversed(self.children):
            child.stop()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


def recorded_points(state_dir: Path, series: str) -> list[tuple[float, float]]:
    """The raw samples the daemon has recorded for ``series`` in its state database (read-only)."""
    import sqlite3

    db = Path(state_dir) / "state.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        return conn.execute(
            "SELECT s.ts, s.value FROM samples s JOIN series n ON n.id = s.series_id WHERE n.name = ? ORDER BY s.ts",
            (series,)).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return []
    finally:
        conn.close()



def pending_messages(state_dir: Path) -> int:
    """Messages in the daemon's outbox not yet delivered (nor given up)."""
    import sqlite3

    db = Path(state_dir) / "state.db"
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        return conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()[0]
    except sqlite3.OperationalError:  # no outbox table: nothing was ever queued
        return 0
    finally:
        conn.close()
