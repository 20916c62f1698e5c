"""[[cleanup]]: the cleanup policies and their safety limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)

from trainguard.config.base import Strict
from trainguard.config.types import Bytes, Duration, Ratio
from trainguard.rootcheck import UnsafeRoot, check_root_on_disk, check_root_text
from trainguard.units import parse_bytes


def _parse_max_delete(value: Any) -> "MaxDelete":
    """ "50GiB" -> bytes; 1000 or "1000 files" -> a file count."""
    if isinstance(value, MaxDelete):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - {"files", "bytes"})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; a table takes files (a count) and/or bytes (a size)")
        files, size = value.get("files"), value.get("bytes")
        if files is not None and (isinstance(files, bool) or not isinstance(files, int) or files < 0):
            raise ValueError(f"files = {files!r} is not a file count >= 0")
        return MaxDelete(files=files, bytes=None if size is None else parse_bytes(size))
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

    @field_validator("max_delete", mode="before")
    @classmethod
    def _guard_off(cls, value: Any) -> Any:
        # false / "off": no guard. An age policy then judges and deletes in one pass.
        return None if value is False or (isinstance(value, str) and value.strip().lower() == "off") else value

    @model_validator(mode="after")
    def _safe(self) -> "_CleanupBase":
        for key in ("patterns", "exclude"):
            if any(not glob for glob in getattr(self, key)):
                raise ValueError(f"policy {self.name!r}: {key} has an empty glob; remove it")
        for root in self.roots:
            try:
                check_root_on_disk(check_root_text(root))
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
    # The name of a [[mirror]]: delete a checkpoint only when the mirror's dest holds an
    # identical copy (every file: same size and mtime); an unanswered share means "keep".
    only_if_mirrored: str | None = Field(None, min_length=1)

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

    type: Literal["pip-cache", "huggingface-cache", "huggingface-datasets-cache", "torch-cache", "conda-cache"]
    patterns: list[str] = ["*"]
    older_than: Duration | None = None
    max_size: Bytes | None = None  # above this, oldest entries go until the cache fits
    all_users: bool = True  # when running as root, every user's home cache too

    @model_validator(mode="after")
    def _has_limit(self) -> "CachePolicy":
        if self.older_than is None and self.max_size is None and not self.watermark:
            raise ValueError(f"policy {self.name!r}: a cache policy needs older_than, max_size or watermark = true")
        return self


class LogsPolicy(_CleanupBase):
    """Growing training logs, rotated in place (copytruncate: the trainer keeps the file open) into
    compressed generations; binary files (event files, checkpoints) are never touched."""

    type: Literal["logs"]
    patterns: list[str] = ["*.log", "*.out", "*.err", "*.txt"]
    max_size: Bytes = 100 * 2**20  # a log above this is rotated
    keep: int = Field(5, ge=0)  # compressed generations kept per log: name.1.gz (newest) .. name.<keep>.gz
    schedule: Duration | None = 600.0
    grace: Duration = 0.0  # a log is rotated while it is being written; that is what it is for
    # "auto": cut the copied part out of the file's head where the filesystem can (ext4, xfs: nothing
    # written meanwhile is lost), else truncate like logrotate's copytruncate; "truncate": always truncate.
    method: Literal["auto", "truncate"] = "auto"

    @model_validator(mode="after")
    def _has_roots(self) -> "LogsPolicy":
        if not self.roots:
            raise ValueError(f"policy {self.name!r}: logs needs roots (the directories holding the logs)")
        return self


def _unique_policy_names(policies: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for policy in policies:
        if policy.name in seen:
            raise ValueError(f"cleanup policy name {policy.name!r} is used twice; names must be unique")
        seen.add(policy.name)
    return policies


def check_mirror_names(policies: list[Any], mirrors: list[Any]) -> None:
    """only_if_mirrored must name a configured [[mirror]]."""
    names = [m.name for m in mirrors]
    for policy in policies:
        wanted = getattr(policy, "only_if_mirrored", None)
        if wanted is not None and wanted not in names:
            known = ", ".join(repr(n) for n in names) or "none configured"
            raise ValueError(f"cleanup policy {policy.name!r}: only_if_mirrored = {wanted!r} names no [[mirror]] "
                             f"(mirrors: {known})")


CleanupPolicy = Annotated[Union[CheckpointsPolicy, AgePolicy, CachePolicy, LogsPolicy], Field(discriminator="type")]
CleanupPolicies = Annotated[list[CleanupPolicy], AfterValidator(_unique_policy_names)]
# The /tmp instance exists but is off until the config enables it.
DEFAULT_CLEANUP = [AgePolicy(name="tmp", type="age", enabled=False)]
