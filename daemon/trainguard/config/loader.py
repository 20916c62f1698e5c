"""The whole configuration: TOML file + TRAINGUARD_* environment overrides, validated by pydantic.

Unknown keys are errors (a typo must not silently disable a rule). Errors are
collected and reported one line per problem, naming the file, the key path, the
bad value and what is allowed. Values under secret keys are never echoed.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from pydantic import ValidationError, model_validator

from trainguard.config.base import Strict
from trainguard.config.cleanup import (
    DEFAULT_CLEANUP,
    CleanupPolicies,
    check_mirror_names,
)
from trainguard.config.environment import ENV_CONFIG, ENV_PREFIX, EnvOverrides, read_env
from trainguard.config.general import Alerts, General, History, Metrics
from trainguard.config.gpu import Gpu
from trainguard.config.mirror import Mirrors
from trainguard.config.notify import Notify
from trainguard.config.progress import Progress
from trainguard.config.storage import Filesystems, Forecast, Io, LogWatch
from trainguard.redact import redact_url, scrub

if TYPE_CHECKING:
    from trainguard.config.web import WebConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG_PATH = "/etc/trainguard/config.toml"
BUILT_IN = "built-in defaults"
__all__ = ["ENV_CONFIG", "ENV_PREFIX"]  # re-exported for callers of this module
# Keys whose values must never be printed back (notify URLs carry tokens).
SECRET_KEYS = frozenset({"url", "urls", "password", "secret", "token", "basic_auth_users"})


class Config(Strict):
    general: General = General()
    filesystems: Filesystems = Filesystems()
    forecast: Forecast = Forecast()
    io: Io = Io()
    alerts: Alerts = Alerts()
    history: History = History()
    notify: Notify = Notify()
    gpu: Gpu = Gpu()
    progress: Progress = Progress()
    logs: list[LogWatch] = []
    cleanup: CleanupPolicies = DEFAULT_CLEANUP
    metrics: Metrics = Metrics()
    mirror: Mirrors = []

    @model_validator(mode="after")
    def _mirror_refs(self) -> "Config":
        check_mirror_names(self.cleanup, self.mirror)
        return self

    @model_validator(mode="after")
    def _owner_routes(self) -> "Config":
        routes = [t.name for t in self.notify.targets if t.owners]
        if self.gpu.act == "notify-owner" and not routes:
            raise ValueError('[gpu] act = "notify-owner" needs a [[notify.targets]] with owners = ["user=...", ...]')
        if self.gpu.act != "notify-owner" and routes:
            raise ValueError(f"notify targets {', '.join(map(repr, routes))} have owners, but [gpu] act is not "
                             '"notify-owner": set it to route stall alerts to owners')
        return self


class ConfigError(Exception):
    """One or more problems in a config; str() is one line per problem, each naming where it came from
    (the file, or the TRAINGUARD_* variable), with anything that looks like a credential masked."""

    def __init__(self, source: str, problems: list[str], origins: list[str | None] | None = None):
        self.source = source
        self.problems = [scrub(p) for p in problems]
        origins = origins or [None] * len(problems)
        self.lines = [f"{origin or source}: {p}" for origin, p in zip(origins, self.problems)]
        super().__init__("\n".join(self.lines))


@dataclass(frozen=True)
class Loaded:
    config: Config
    source: str  # the file read, or "built-in defaults"
    env_vars: tuple[str, ...] = ()  # the TRAINGUARD_* variables merged over it
    web: WebConfig | None = None  # metrics.web_config's file, read and checked

    @property
    def sources(self) -> str:
        """What was merged, for people: "/etc/trainguard/config.toml + TRAINGUARD_GENERAL__INTERVAL"."""
        return " + ".join((self.source, *self.env_vars))


def _is_secret(loc: tuple[Any, ...]) -> bool:
    return any(isinstance(part, str) and part.lower() in SECRET_KEYS for part in loc)


def _describe(error: Mapping[str, Any], allowed: str = "config.example.toml") -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key (check the spelling; allowed keys are in {allowed})"
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
    """TRAINGUARD_FILESYSTEMS__WARNING=80% -> {"filesystems": {"warning": "80%"}} (see config.environment)."""
    return read_env(environ, Config.model_fields).tree


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


_ENV_LIST_HINT = "; in the environment a list is one variable holding JSON, e.g. '[\"/data\"]' or '[{...}]'"


def parse(data: Mapping[str, Any], source: str, env: EnvOverrides | None = None) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        origins = [env.origin_of(e["loc"]) if env else None for e in errors]
        problems = [_describe(e) + (_ENV_LIST_HINT if origin and e["type"] == "list_type" else "")
                    for e, origin in zip(errors, origins)]
        raise ConfigError(source, problems, origins) from None
    except RecursionError:
        raise ConfigError(source, ["nested too deeply to be a trainguard config"]) from None


def _open_regular(path: str | os.PathLike[str]) -> int | None:
    """An fd of the file to read, None for /dev/null. Only a regular file is read: a FIFO or a device
    would block or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except PermissionError:
        raise ConfigError(str(path), ["permission denied (cannot read the file)"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot be opened: {exc.strerror}"]) from None
    st = os.fstat(fd)
    mode = st.st_mode
    if stat.S_ISCHR(mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
        os.close(fd)
        return None
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ConfigError(str(path), ["is a directory, not a file"])
        raise ConfigError(str(path), ["is not a regular file (a FIFO, socket or device)"])
    return fd


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's TOML."""
    fd = _open_regular(path)
    if fd is None:
        return {}  # --config /dev/null: explicitly no file, the built-in defaults
    with os.fdopen(fd, "rb") as fh:
        try:
            return tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(path), [f"TOML syntax error: {exc}"]) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(str(path), [f"not UTF-8 text: {exc}"]) from None
        except RecursionError:
            raise ConfigError(str(path), ["nested too deeply to be a trainguard config"]) from None
        except OSError as exc:
            raise ConfigError(str(path), [f"cannot be read: {exc.strerror}"]) from None


def read_web_config(path: str, setting: str = "metrics.web_config") -> WebConfig:
    """The web config file: YAML in exporter-toolkit's format, checked down to its certificates.
    Its problems name the file and the setting (or variable) that points at it."""
    import yaml  # only a daemon given a web config pays for it (1.4 MiB), and for ssl (4 ms)

    from trainguard.config.web import WebConfig, server_context

    source = f"{path} ({setting})"
    try:
        fd = _open_regular(path)
    except ConfigError as exc:
        raise ConfigError(source, exc.problems) from None
    if fd is None:
        return WebConfig()
    with os.fdopen(fd, "rb") as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(source, [f"YAML syntax error{where}: {getattr(exc, 'problem', None) or exc}"]) from None
        except (OSError, ValueError, RecursionError) as exc:
            raise ConfigError(source, [f"cannot be read: {exc}"]) from None
    try:
        web = WebConfig.model_validate(data or {}).relative_to(os.path.dirname(os.path.abspath(path)))
    except ValidationError as exc:
        raise ConfigError(source, [_describe(e, "exporter-toolkit's web configuration docs").removeprefix(
            "(top level): ") for e in exc.errors()]) from None
    try:
        server_context(web.tls_server_config)  # a key that does not match its certificate is found now
    except ValueError as exc:
        raise ConfigError(source, [str(exc)]) from None
    return web


def load(path: str | None = None, environ: Mapping[str, str] | None = None) -> Loaded:
    """Load the effective config.

    path given (--config) or $TRAINGUARD_CONFIG: that file must exist.
    Otherwise /etc/trainguard/config.toml if present, else the built-in defaults.
    TRAINGUARD_<SECTION>__<KEY> variables are merged over it (config.environment).
    """
    environ = os.environ if environ is None else environ
    explicit = path or environ.get(ENV_CONFIG)
    if explicit:
        data, source = read_toml(explicit), str(explicit)
    elif os.path.exists(DEFAULT_CONFIG_PATH):
        data, source = read_toml(DEFAULT_CONFIG_PATH), DEFAULT_CONFIG_PATH
    else:
        data, source = {}, BUILT_IN
    env = read_env(environ, Config.model_fields)
    if env.problems:
        raise ConfigError("environment", [text for _, text in env.problems], [name for name, _ in env.problems])
    if env.tree:
        data = _merge(data, env.tree)
    config = parse(data, source, env)
    web = None
    if config.metrics.web_config:
        web = read_web_config(config.metrics.web_config, env.origin_of(("metrics", "web_config")) or
                              "metrics.web_config")
    return Loaded(config, source, tuple(env.variables), web)


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
