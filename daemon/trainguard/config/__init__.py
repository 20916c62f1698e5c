"""Configuration, one module per section family; this package imports nothing from the pipeline.

`trainguard.config.load()` gives the effective config; the section models are re-exported here so
callers write `from trainguard.config import Gpu`.
"""

from trainguard.config.base import Strict
from trainguard.config.cleanup import (
    AGE_EXCLUDES,
    CHECKPOINT_DIR_PATTERNS,
    CHECKPOINT_PATTERNS,
    DEFAULT_CLEANUP,
    AgePolicy,
    CachePolicy,
    CheckpointsPolicy,
    CleanupPolicy,
    LogsPolicy,
    MaxDelete,
)
from trainguard.config.general import Alerts, General, History, Metrics, parse_listen
from trainguard.config.gpu import Gpu, GpuOverride, GpuRule, ThrottleReason
from trainguard.config.loader import (
    DEFAULT_CONFIG_PATH,
    ENV_CONFIG,
    ENV_PREFIX,
    SECRET_KEYS,
    Config,
    ConfigError,
    Loaded,
    dump,
    env_overrides,
    load,
    parse,
    read_toml,
    read_web_config,
)
from trainguard.config.mirror import Mirror, mirrored_path
from trainguard.config.notify import Notify, NotifyTarget
from trainguard.config.progress import Progress
from trainguard.config.storage import (
    DEFAULT_LOG_PATTERNS,
    Filesystems,
    Forecast,
    Io,
    LogWatch,
    MountOverride,
    Thresholds,
)
from trainguard.redact import redact_url

__all__ = [
    "AGE_EXCLUDES", "CHECKPOINT_DIR_PATTERNS", "CHECKPOINT_PATTERNS", "DEFAULT_CLEANUP", "DEFAULT_CONFIG_PATH",
    "DEFAULT_LOG_PATTERNS", "ENV_CONFIG", "ENV_PREFIX", "SECRET_KEYS", "AgePolicy", "Alerts", "CachePolicy",
    "CheckpointsPolicy", "CleanupPolicy", "Config", "ConfigError", "Filesystems", "Forecast", "General", "Gpu",
    "GpuOverride", "GpuRule", "History", "Io", "Loaded", "LogWatch", "LogsPolicy", "MaxDelete", "Metrics", "Mirror", "mirrored_path", "MountOverride",
    "Notify", "NotifyTarget", "Progress", "Strict", "ThrottleReason", "Thresholds", "dump", "env_overrides", "load", "parse",
    "parse_listen", "read_toml", "read_web_config", "redact_url",
]
