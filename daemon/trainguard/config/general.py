"""[general], [alerts], [history] and [metrics]: how the daemon itself runs."""

from __future__ import annotations

import logging
import socket
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trainguard.config.base import Strict
from trainguard.config.types import Duration, PositiveDuration


class General(Strict):
    hostname: str = ""  # empty: the machine's host name
    state_dir: str = "/var/lib/trainguard"
    interval: PositiveDuration = 10.0
    proc_root: str = "/proc"  # a sidecar points it at /host/proc
    # Where the host's / is visible (a sidecar bind-mounts it at /host/root): statfs of a host
    # mount point goes through this prefix. Mount points in reports stay host paths.
    host_root: str = "/"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        """general.sys_root was never read (nothing under /sys is): an old config still loads, with a warning."""
        if isinstance(data, dict) and "sys_root" in data:
            logging.getLogger("trainguard.config").warning(
                "general.sys_root (TRAINGUARD_GENERAL__SYS_ROOT) is no longer used and is ignored; remove it")
            data = {k: v for k, v in data.items() if k != "sys_root"}
        return data

    @property
    def host(self) -> str:
        return self.hostname or socket.gethostname()


class Alerts(Strict):
    repeat_interval: PositiveDuration = 4 * 3600.0
    # A firing alert resolves only after its condition has been gone this long:
    # a value flapping around a threshold does not produce a message storm.
    keep_firing_for: Duration = 60.0


class History(Strict):
    raw_retention: PositiveDuration = 24 * 3600.0  # full-resolution samples
    retention: PositiveDuration = 14 * 86400.0  # 5-minute averages beyond that
    rollup: PositiveDuration = 300.0
    # Cleanup's audit log (one row per directory a run deleted from); "freed in total" is kept apart.
    audit_retention: PositiveDuration = 90 * 86400.0


class Metrics(Strict):
    """Prometheus /metrics endpoint. listen = "" turns it off."""

    listen: str = "127.0.0.1:9842"  # "host:port", "[::1]:port" or ":port" (all addresses)
    # exporter-toolkit's web config file (TLS, basic auth, headers), as node_exporter's --web.config.file.
    web_config: str = ""
    # Connections held at once. Half at most may be new (before their first request is answered): a flood
    # of silent or slow clients waits in the listen queue, and a kept connection (Prometheus') is not dropped.
    max_connections: int = Field(16, ge=1, le=1024)

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str) -> str:
        value = value.strip()
        if value:
            parse_listen(value)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) to bind, or None when the endpoint is off."""
        return parse_listen(self.listen) if self.listen else None


def parse_listen(value: str) -> tuple[str, int]:
    """"127.0.0.1:9842" -> ("127.0.0.1", 9842); "[::1]:9842" -> ("::1", 9842); ":9842" -> ("0.0.0.0", 9842)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # port 0: any free port (tests)
        raise ValueError(f"expected host:port with a port 0-65535, e.g. 127.0.0.1:9842 (got {value!r})")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
