"""A real Prometheus server for end-to-end tests of the rules against a running trainguard.

``Prometheus`` starts the distribution's binary on 127.0.0.1 with a free port, a temporary
TSDB, a 1 s scrape and evaluation interval and a copy of the shipped rules whose `for:` are
shortened (the thresholds and expressions stay as shipped). It is always stopped by PID.
``alerts()`` reads /api/v1/alerts; ``wait_alert()`` polls it for a state change.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.daemon_proc import wait_until

BINARY = "/usr/bin/prometheus"


def prometheus_binary() -> str | None:
    return BINARY if Path(BINARY).exists() else shutil.which("prometheus")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_for(rules_text: str, for_: str) -> str:
    """The rules with every `for:` set to `for_`: the same alerts, fired in test time."""
    return re.sub(r"(?m)^(\s+for:\s*)\S+(.*)$", lambda m: f"{m.group(1)}{for_}", rules_text)


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], rules: Path, *, for_: str = "3s",
                 interval: str = "1s", scrape: dict | None = None, jobs: tuple[dict, ...] = ()):
        """`scrape`: more settings of the trainguard job (scheme, tls_config, basic_auth); `jobs`: more jobs."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.rules = workdir / "rules.yml"
        self.rules.write_text(short_for(rules.read_text(), for_))
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(self.rules)],
            "scrape_configs": [{"job_name": "trainguard", "static_configs": [{"targets": targets}], **(scrape or {})},
                               *jobs],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> Prometheus:
        binary = prometheus_binary()
        assert binary, "prometheus not installed"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir)
        wait_until(self._ready, timeout, interval=0.2, what=f"Prometheus ready on {self.url}")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query?" + urllib.parse.urlencode({"query": expr}))["result"]

    def alerts(self, name: str) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def wait_alert(self, name: str, state: str | None, timeout: float = 60.0, **labels: str) -> dict | None:
        """Poll until alert `name` (with these labels) is in `state`; None: until it is gone."""
        seen: list[str] = []

        def check():
            mine = [a for a in self.alerts(name) if all(a["labels"].get(k) == v for k, v in labels.items())]
            seen.append(",".join(a["state"] for a in mine) or "-")
            if state is None:
                return not mine
            return next((a for a in mine if a["state"] == state), None)
        found = wait_until(check, timeout, interval=0.2,
                           what=f"{name} {state or 'resolved'} (states seen: {' '.join(dict.fromkeys(seen))})")
        return found if state is not None else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
