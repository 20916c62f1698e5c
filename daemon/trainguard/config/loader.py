"""The whole configuration: TOML file + TRAINGUARD_* environment overrides, validated by pydantic.

Unknown keys are errors (a typo must not silently disable a rule). Errors are
collected and reported one line per problem, naming the file, the key path, the
bad value and what is allowed. Values under secret keys are never echoed.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import ValidationError, model_validator

from trainguard.config.base import Strict
from trainguard.config.cleanup import DEFAULT_CLEANUP, CleanupPolicies, check_mirror_names
from trainguard.config.general import Alerts, General, History, Metrics
from trainguard.config.gpu import Gpu
from trainguard.config.mirror import Mirrors
from trainguard.config.notify import Notify
from trainguard.config.storage import Filesystems, Forecast, Io, LogWatch
from trainguard.redact import redact_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG_PATH = "/etc/trainguard/config.toml"
ENV_CONFIG = "TRAINGUARD_CONFIG"
ENV_PREFIX = "TRAINGUARD_"
# Keys whose values must never be printed back (notify URLs carry tokens).
SECRET_KEYS = frozenset({"url", "urls", "password", "secret", "token"})


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
    mirror: Mirrors = []

    @model_validator(mode="after")
    def _mirror_refs(self) -> "Config":
        check_mirror_names(self.cleanup, self.mirror)
        return self


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
