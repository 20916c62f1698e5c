"""Configuration: TOML file + TRAINGUARD_* environment overrides, validated by pydantic.

Unknown keys are errors (a typo must not silently disable a rule). Errors are
collected and reported one line per problem, naming the file, the key path, the
bad value and what is allowed. Values under secret keys are never echoed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainguard.redact import redact_url  # noqa: F401 - part of this module's interface
from trainguard.units import Bytes, Duration, Ratio, format_duration, parse_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG_PATH = "/etc/trainguard/config.toml"
ENV_CONFIG = "TRAINGUARD_CONFIG"
ENV_PREFIX = "TRAINGUARD_"
# Keys whose values must never be printed back (notify URLs carry tokens).
SECRET_KEYS = frozenset({"url", "urls", "password", "secret", "token"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class General(Strict):
    hostname: str = ""  # empty: the machine's host name
    state_dir: str = "/var/lib/trainguard"
    interval: Duration = 10.0
    proc_root: str = "/proc"  # a sidecar points these at /host/proc, /host/sys
    sys_root: str = "/sys"
    # Where the host's / is visible (a sidecar bind-mounts it at /host/root): statfs of a host
    # mount point goes through this prefix. Mount points in reports stay host paths.
    host_root: str = "/"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def host(self) -> str:
        return self.hostname or socket.gethostname()


class Thresholds(Strict):
    warning: Ratio = 0.85
    critical: Ratio = 0.90
    inodes_warning: Ratio = 0.85
    inodes_critical: Ratio = 0.90

    @model_validator(mode="after")
    def _ordered(self) -> "Thresholds":
        if self.warning > self.critical:
            raise ValueError(f"warning ({self.warning:.0%}) is above critical ({self.critical:.0%})")
        if self.inodes_warning > self.inodes_critical:
            raise ValueError(
                f"inodes_warning ({self.inodes_warning:.0%}) is above inodes_critical ({self.inodes_critical:.0%})"
            )
        return self


class MountOverride(Strict):
    """Per-mount thresholds, matched by mount point or glob ("/root/autodl-*")."""

    match: str
    warning: Ratio | None = None
    critical: Ratio | None = None
    inodes_warning: Ratio | None = None
    inodes_critical: Ratio | None = None
    ignore: bool = False


class Filesystems(Thresholds):
    paths: list[str] = []  # always watched; each path is resolved to its mount
    exclude: list[str] = []  # mount point globs never watched
    include_fstypes: list[str] = []  # extra fstypes to watch besides the built-in list
    probe_timeout: Duration = 5.0
    hysteresis: Ratio = 0.03  # a usage alert clears this far below its threshold
    for_: Duration = Field(0.0, alias="for")
    overrides: list[MountOverride] = []

    @field_validator("overrides")
    @classmethod
    def _overrides_ordered(cls, overrides: list[MountOverride], info: ValidationInfo) -> list[MountOverride]:
        # Each override is merged over the global levels: refuse one that inverts them here, with its
        # match, instead of leaving a mount the detector cannot evaluate.
        levels = {k: info.data[k] for k in ("warning", "critical", "inodes_warning", "inodes_critical")
                  if k in info.data}
        if len(levels) < 4:
            return overrides  # a global level is itself invalid and already reported
        problems = []
        for i, override in enumerate(overrides):
            merged = {**levels, **{k: v for k in levels if (v := getattr(override, k)) is not None}}
            for low, high in (("warning", "critical"), ("inodes_warning", "inodes_critical")):
                if merged[low] > merged[high]:
                    problems.append(f"override {i} (match {override.match!r}): {low} ({merged[low]:.0%}) "
                                    f"is above {high} ({merged[high]:.0%})")
        if problems:
            raise ValueError("; ".join(problems))
        return overrides

    def thresholds_for(self, mount_point: str) -> Thresholds:
        names = ("warning", "critical", "inodes_warning", "inodes_critical")
        values = {k: getattr(self, k) for k in names}
        for override in self.overrides:
            if fnmatch.fnmatchcase(mount_point, override.match):
                values.update({k: v for k in names if (v := getattr(override, k)) is not None})
        # Already validated; two globs matching one mount may combine out of order, which must not raise.
        return Thresholds.model_construct(**values)

    def ignored(self, mount_point: str) -> bool:
        if any(fnmatch.fnmatchcase(mount_point, g) for g in self.exclude):
            return True
        return any(o.ignore and fnmatch.fnmatchcase(mount_point, o.match) for o in self.overrides)


class Forecast(Strict):
    enabled: bool = True
    window: Duration = 6 * 3600.0  # how much history the trend is fitted on
    min_span: Duration = 30 * 60.0  # no forecast before this much data
    warning: Duration = 6 * 3600.0  # warn when the filesystem fills within this
    critical: Duration = 3600.0

    @model_validator(mode="after")
    def _ordered(self) -> "Forecast":
        if self.critical > self.warning:
            raise ValueError(f"critical ({format_duration(self.critical)}) is longer than warning "
                             f"({format_duration(self.warning)}); critical must be the shorter time to full")
        if self.min_span > self.window:
            raise ValueError(f"min_span ({format_duration(self.min_span)}) is longer than window "
                             f"({format_duration(self.window)}); no forecast could ever be made")
        return self


class Io(Strict):
    util_threshold: Ratio = 0.90
    for_: Duration = Field(300.0, alias="for")


class Alerts(Strict):
    repeat_interval: Duration = 4 * 3600.0
    # A firing alert resolves only after its condition has been gone this long:
    # a value flapping around a threshold does not produce a message storm.
    keep_firing_for: Duration = 60.0


class History(Strict):
    raw_retention: Duration = 24 * 3600.0  # full-resolution samples
    retention: Duration = 14 * 86400.0  # 5-minute averages beyond that
    rollup: Duration = 300.0


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
    timeout: Duration = 10.0  # one delivery attempt (connect and read) gives up after this

    @model_validator(mode="after")
    def _has_scheme(self) -> "NotifyTarget":
        if "://" not in self.url:
            raise ValueError(f"target {self.name!r}: url must be an apprise URL like dingtalk://... or "
                             f"mailtos://... (value hidden)")
        return self


class Notify(Strict):
    targets: list[NotifyTarget] = []
    # Wait this long after a new alert before sending, to batch others of the same cycle (0: send at once).
    group_wait: Duration = 0.0
    # After a message to a target, further alerts wait this long and go out together.
    group_interval: Duration = 10.0
    retry_initial: Duration = 10.0  # first retry after a failed delivery; doubles each time (with jitter) ...
    retry_max: Duration = 600.0  # ... up to this
    max_age: Duration = 24 * 3600.0  # an undelivered message older than this is given up (logged as an error)
    max_pending: int = Field(10_000, ge=1)  # outbox bound: beyond it the oldest low-severity messages are dropped

    @model_validator(mode="after")
    def _unique_names(self) -> "Notify":
        names = [t.name for t in self.targets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"target names must be unique: {', '.join(map(repr, duplicates))} repeated")
        if self.retry_initial > self.retry_max:
            raise ValueError("retry_initial is above retry_max")
        return self


class GpuOverride(Strict):
    """Per-GPU stall thresholds, matched by index ("0"), UUID or name glob ("*A100*")."""

    match: str
    vram_ratio: Ratio | None = None
    util_floor: Ratio | None = None
    for_: Duration | None = Field(None, alias="for")
    ignore: bool = False


class GpuRule(Strict):
    vram_ratio: Ratio
    util_floor: Ratio
    for_: Duration = Field(alias="for")
    ignore: bool = False


# Throttle reasons that mean the GPU is slowed by heat or power delivery, not by normal load
# (SW power capping is routine at full load and is left out by default).
ThrottleReason = Literal["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]


class Gpu(Strict):
    enabled: bool = True
    interval: Duration | None = None  # None: general.interval
    # Stall: VRAM used >= vram_ratio and utilisation <= util_floor, averaged over `for`,
    # on a GPU that has a compute process.
    vram_ratio: Ratio = 0.8
    util_floor: Ratio = 0.05
    for_: Duration = Field(300.0, alias="for")
    overrides: list[GpuOverride] = []
    orphan_for: Duration = 60.0  # memory held by a dead/zombie process this long -> alert
    xid_hold: Duration = 3600.0  # an XID alert stays up this long after the last event
    throttle_for: Duration = 600.0
    throttle_reasons: list[ThrottleReason] = [
        "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake",
    ]
    # NVML reports host PIDs. "auto": trust them when our /proc is the host PID namespace.
    host_pid_namespace: Literal["auto", "yes", "no"] = "auto"
    py_spy: bool = True  # name Python threads with `py-spy dump` when it is installed

    def rule_for(self, index: int, uuid: str = "", name: str = "") -> GpuRule:
        values: dict[str, Any] = {"vram_ratio": self.vram_ratio, "util_floor": self.util_floor,
                                  "for": self.for_, "ignore": False}
        for override in self.overrides:
            if override.match == str(index) or override.match == uuid or (
                name and fnmatch.fnmatchcase(name, override.match)
            ):
                values.update(override.model_dump(exclude={"match"}, exclude_none=True, by_alias=True))
        return GpuRule.model_validate(values)


DEFAULT_LOG_PATTERNS = (
    "No space left on device",
    "FileNotFoundError.*tfevents",
    "CUDA out of memory",
    "NCCL.*[Tt]imeout",
    "Traceback",
)


class LogWatch(Strict):
    """[[logs]]: training log files (globs) and the patterns that become findings."""

    paths: list[str]
    patterns: list[str] = list(DEFAULT_LOG_PATTERNS)
    observer: Literal["auto", "inotify", "polling"] = "auto"  # auto: polling on network/FUSE mounts
    hold: Duration = 1800.0  # a match stays an active finding this long
    severity: Literal["warning", "critical"] = "warning"

    @model_validator(mode="after")
    def _patterns_compile(self) -> "LogWatch":
        import re

        if not self.paths:
            raise ValueError("paths is empty: give at least one log file or glob")
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
        return self


def _parse_max_delete(value: Any) -> "MaxDelete":
    """ "50GiB" -> bytes; 1000 or "1000 files" -> a file count."""
    if isinstance(value, MaxDelete):
        return value
    if isinstance(value, Mapping):
        return MaxDelete(**value)
    if isinstance(value, bool):
        raise ValueError('expected a size like "500GiB" or a file count like 1000 or "1000 files"')
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return MaxDelete(files=value)
    if isinstance(value, str) and value.strip().lower().endswith("files"):
        number = value.strip()[:-5].strip()
        if number.isdigit():
            return MaxDelete(files=int(number))
        raise ValueError(f'{value!r} is not a file count like "1000 files"')
    try:
        return MaxDelete(bytes=parse_bytes(value))
    except ValueError:
        raise ValueError(
            f'{value!r} is neither a size like "500GiB" nor a file count like 1000 or "1000 files"'
        ) from None


@dataclass(frozen=True, slots=True)
class MaxDelete:
    """Upper bound on what one run of a policy may delete; above it the run stops and warns."""

    bytes: int | None = None
    files: int | None = None

    def exceeded_by(self, files: int, nbytes: int) -> bool:
        return (self.files is not None and files > self.files) or (self.bytes is not None and nbytes > self.bytes)

    def __str__(self) -> str:
        return f"{self.files} files" if self.files is not None else f"{self.bytes}B"


MaxDeleteLimit = Annotated[
    MaxDelete, BeforeValidator(_parse_max_delete), PlainSerializer(str, return_type=str)
]


class _CleanupBase(Strict):
    """What every cleanup policy has: where, when, and the safety limits."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    enabled: bool = True
    roots: list[str] = []
    patterns: list[str] = []
    exclude: list[str] = []  # globs on the name or the path relative to the root; excluded dirs are not entered
    # Triggers: every `schedule` seconds, and/or when the filesystem holding a root is
    # at or above `high`, deleting oldest-first until it is at or below `low`.
    # Neither: the policy runs only from `trainguard cleanup`.
    schedule: Duration | None = None
    watermark: bool = False
    high: Ratio = 0.85
    low: Ratio = 0.80
    grace: Duration = 600.0  # files changed this recently may still be being written
    max_delete: MaxDeleteLimit | None = MaxDelete(files=10000)

    @model_validator(mode="after")
    def _safe(self) -> "_CleanupBase":
        from trainguard.actions.safety import UnsafeRoot, check_root_text

        for root in self.roots:
            try:
                check_root_text(root)
            except UnsafeRoot as exc:
                raise ValueError(f"policy {self.name!r}: {exc}") from None
        if self.low > self.high:
            raise ValueError(f"policy {self.name!r}: low ({self.low:.0%}) is above high ({self.high:.0%})")
        if self.schedule is not None and self.schedule < 60:
            raise ValueError(f"policy {self.name!r}: schedule {self.schedule:g}s is shorter than 60s")
        return self


CHECKPOINT_PATTERNS = ["*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.bin"]
CHECKPOINT_DIR_PATTERNS = ["checkpoint-*", "global_step*"]


class CheckpointsPolicy(_CleanupBase):
    """Old checkpoints, grouped per run directory; the newest of a group always stays."""

    type: Literal["checkpoints"]
    patterns: list[str] = CHECKPOINT_PATTERNS
    dir_patterns: list[str] = CHECKPOINT_DIR_PATTERNS  # directories deleted as one unit
    keep_last: int = Field(5, ge=1)
    keep_every: int | None = Field(None, ge=1)  # keep checkpoints whose step is a multiple of this
    older_than: Duration | None = None
    max_delete: MaxDeleteLimit | None = MaxDelete(files=1000)

    @model_validator(mode="after")
    def _has_roots(self) -> "CheckpointsPolicy":
        if not self.roots:
            raise ValueError(f"policy {self.name!r}: checkpoints needs roots (the directories holding runs)")
        return self


AGE_EXCLUDES = [
    ".X11-unix", ".ICE-unix", ".XIM-unix", ".font-unix", ".Test-unix", "systemd-private-*",
    "snap-private-tmp", "tmux-*", "*.lock", "*.pid", "lock", ".lock",
]


class AgePolicy(_CleanupBase):
    """Files not used for `older_than`, like systemd-tmpfiles (the default instance is /tmp, 1 day)."""

    type: Literal["age"]
    roots: list[str] = ["/tmp"]
    patterns: list[str] = ["*"]
    older_than: Duration = 86400.0
    age_by: list[Literal["atime", "mtime", "ctime"]] = ["atime", "mtime", "ctime"]  # newest of these
    exclude: list[str] = AGE_EXCLUDES
    remove_empty_dirs: bool = True

    @field_validator("age_by")
    @classmethod
    def _nonempty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("age_by needs at least one of atime, mtime, ctime")
        return value


class CachePolicy(_CleanupBase):
    """A tool's download cache, found the way the tool finds it (roots = [] means: locate it)."""

    type: Literal["pip-cache", "huggingface-cache", "torch-cache", "conda-cache"]
    patterns: list[str] = ["*"]
    older_than: Duration | None = None
    max_size: Bytes | None = None  # above this, oldest entries go until the cache fits
    all_users: bool = True  # when running as root, every user's home cache too

    @model_validator(mode="after")
    def _has_limit(self) -> "CachePolicy":
        if self.older_than is None and self.max_size is None and not self.watermark:
            raise ValueError(f"policy {self.name!r}: a cache policy needs older_than, max_size or watermark = true")
        return self


def _unique_policy_names(policies: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for policy in policies:
        if policy.name in seen:
            raise ValueError(f"cleanup policy name {policy.name!r} is used twice; names must be unique")
        seen.add(policy.name)
    return policies


CleanupPolicy = Annotated[Union[CheckpointsPolicy, AgePolicy, CachePolicy], Field(discriminator="type")]
CleanupPolicies = Annotated[list[CleanupPolicy], AfterValidator(_unique_policy_names)]
# The /tmp instance exists but is off until the config enables it.
DEFAULT_CLEANUP = [AgePolicy(name="tmp", type="age", enabled=False)]


class Metrics(Strict):
    """Prometheus /metrics endpoint. listen = "" turns it off."""

    listen: str = "127.0.0.1:9842"  # "host:port", "[::1]:port" or ":port" (all addresses)

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


class Config(Strict):
    general: General = General()
    filesystems: Filesystems = Filesystems()
    forecast: Forecast = Forecast()
    io: Io = Io()
    alerts: Alerts = Alerts()
    history: History = History()
    notify: Notify = Notify()
    gpu: Gpu = Gpu()
    logs: list[LogWatch] = []
    cleanup: CleanupPolicies = DEFAULT_CLEANUP
    metrics: Metrics = Metrics()


class ConfigError(Exception):
    """One or more problems in a config; str() is one line per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


@dataclass(frozen=True)
class Loaded:
    config: Config
    source: str  # the file read, or "built-in defaults"


def _is_secret(loc: tuple[Any, ...]) -> bool:
    return any(isinstance(part, str) and part.lower() in SECRET_KEYS for part in loc)


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key (check the spelling; allowed keys are in config.example.toml)"
    if error["type"] == "literal_error":
        return f"{path}: {message}, got {error['input']!r}"
    if _is_secret(loc):
        return f"{path}: {message} (value hidden)"
    if error["type"] in ("value_error", "assertion_error") and "input" in error and not isinstance(
        error["input"], (dict, list)
    ):
        if repr(error["input"]) in message:
            return f"{path}: {message}"
        return f"{path}: {message} (got {error['input']!r})"
    if "input" in error and not isinstance(error["input"], (dict, list)):
        return f"{path}: {message}, got {error['input']!r}"
    return f"{path}: {message}"


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """TRAINGUARD_FILESYSTEMS__WARNING=80% -> {"filesystems": {"warning": "80%"}}.

    Values that look like JSON lists/objects are parsed, so
    TRAINGUARD_FILESYSTEMS__PATHS='["/data"]' works in a container.
    """
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG or "__" not in name:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        stripped = value.strip()
        if stripped[:1] in "[{":
            try:
                node[parts[-1]] = json.loads(stripped)
                continue
            except json.JSONDecodeError:
                pass
        node[parts[-1]] = value
    return tree


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse(data: Mapping[str, Any], source: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_describe(e) for e in exc.errors()]) from None


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except PermissionError:
        raise ConfigError(str(path), ["permission denied (cannot read the file)"]) from None
    except IsADirectoryError:
        raise ConfigError(str(path), ["is a directory, not a TOML file"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"TOML syntax error: {exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text: {exc}"]) from None


def load(path: str | None = None, environ: Mapping[str, str] | None = None) -> Loaded:
    """Load the effective config.

    path given (--config) or $TRAINGUARD_CONFIG: that file must exist.
    Otherwise /etc/trainguard/config.toml if present, else the built-in defaults.
    """
    environ = os.environ if environ is None else environ
    explicit = path or environ.get(ENV_CONFIG)
    if explicit:
        data, source = read_toml(explicit), str(explicit)
    elif os.path.exists(DEFAULT_CONFIG_PATH):
        data, source = read_toml(DEFAULT_CONFIG_PATH), DEFAULT_CONFIG_PATH
    else:
        data, source = {}, "built-in defaults"
    overrides = env_overrides(environ)
    if overrides:
        data = _merge(data, overrides)
    return Loaded(parse(data, source), source)


def dump(config: Config) -> dict[str, Any]:
    """The effective config as plain data with human units and secrets redacted."""
    data = config.model_dump(mode="json", by_alias=True)
    return _redact(data)


def _redact(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _redact(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_redact(v, key) for v in node]
    if key.lower() in SECRET_KEYS and isinstance(node, str) and node:
        return redact_url(node) if "://" in node else "***"
    return node
