"""[notify]: where alerts go and how delivery retries."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainguard.config.base import Strict
from trainguard.config.types import Duration, PositiveDuration


# What an owner route matches on: the owner facts of a GPU process (sources.owner), by these names.
OWNER_KEYS = ("user", "namespace", "pod", "slurm_account", "slurm_user", "slurm_job")


class NotifyTarget(Strict):
    """One apprise URL. The URL carries tokens and passwords: it is only ever shown redacted."""

    name: str
    url: str
    # The least severe alert this target receives ("critical": e-mail only for the worst).
    severity: Literal["info", "warning", "critical"] = "info"
    # Routing: when set, only alerts with one of these tags reach the target. An alert's tags are
    # its detector ("fs.usage", "fs"), and its labels as "name=value" ("mountpoint=/data").
    tags: list[str] = []
    # Messages per minute; 0: the service's own limit (DingTalk robots: 20/min), else unlimited.
    rate_limit: int = Field(0, ge=0)
    timeout: PositiveDuration = 10.0  # one delivery attempt (connect and read) gives up after this
    # The language of this target's messages ("en", "zh"); unset: [notify] language.
    language: Literal["en", "zh"] | None = None
    # An owner route ([gpu] act = "notify-owner"): only alerts about GPU processes of these owners reach it,
    # "key=value" with key one of OWNER_KEYS and a value or glob ("user=alice", "namespace=team-*").
    owners: list[str] = []

    @model_validator(mode="after")
    def _has_scheme(self) -> "NotifyTarget":
        if "://" not in self.url:
            raise ValueError(f"target {self.name!r}: url must be an apprise URL like dingtalk://... or "
                             f"mailtos://... (value hidden)")
        for owner in self.owners:
            key, sep, value = owner.partition("=")
            if not sep or key not in OWNER_KEYS or not value:
                raise ValueError(f"target {self.name!r}: owners entry {owner!r} must be key=value with key one of "
                                 f"{', '.join(OWNER_KEYS)}")
        return self


class Notify(Strict):
    targets: list[NotifyTarget] = []
    # The language of alerts, test alerts, `status` and `diagnose` ("en", "zh"); a target may set its own.
    language: Literal["en", "zh"] = "en"
    # Wait this long after a new alert before sending, to batch others of the same cycle (0: send at once).
    group_wait: Duration = 0.0
    # After a message to a target, further alerts wait this long and go out together.
    group_interval: Duration = 10.0
    retry_initial: PositiveDuration = 10.0  # first retry after a failed delivery; doubles each time (with jitter) ...
    retry_max: PositiveDuration = 600.0  # ... up to this
    max_age: PositiveDuration = 24 * 3600.0  # an undelivered message older than this is given up (logged as an error)
    max_pending: int = Field(10_000, ge=1)  # outbox bound: beyond it the oldest low-severity messages are dropped

    def language_for(self, target: NotifyTarget) -> str:
        return target.language or self.language

    @model_validator(mode="after")
    def _unique_names(self) -> "Notify":
        names = [t.name for t in self.targets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"target names must be unique: {', '.join(map(repr, duplicates))} repeated")
        if self.retry_initial > self.retry_max:
            raise ValueError("retry_initial is above retry_max")
        return self
