"""What each cleanup policy selects. Selection is pure; scanning feeds it.

- checkpoints: pattern-matched files and checkpoint directories (one unit each),
  grouped per run directory, kept by step number or mtime (keep_last, keep_every,
  older_than); the newest of a group and anything still being written always stay.
- age: systemd-tmpfiles-like expiry by the newest of atime/mtime/ctime.
- caches (pip, huggingface hub and datasets, torch hub, conda pkgs): located the way each tool does,
  expired by age and/or cut down to a size cap; a cache whose lock is held is skipped.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, TypeVar

from trainguard.config import AgePolicy, CachePolicy, CheckpointsPolicy
from trainguard.units import format_duration


@dataclass(frozen=True, slots=True)
class Candidate:
    """Something a policy would delete: one file, or one directory unit."""

    root: str  # the root's real path
    relpath: str  # below the root, "/"-joined
    dev: int
    ino: int
    bytes: int  # what deleting it frees (0 for a file with other hard links)
    files: int  # 1, or the number of files in a unit
    is_unit: bool
    age_ts: float  # the time its age is measured from; oldest first = smallest first
    reason: str  # e.g. "keep_last=5: 7th newest (step 300)"


# ---------------------------------------------------------------- matching


def matches_any_part(relpath: str, globs: Sequence[str]) -> bool:
    """A glob matches some component of the path (the entry or a directory above it)."""
    return any(fnmatch.fnmatchcase(part, glob) for part in relpath.split("/") for glob in globs)


class GlobSet:
    """Globs compiled into one regex each for names and for relative paths: one match call per entry."""

    __slots__ = ("name_match", "path_match", "everything")

    def __init__(self, globs: Sequence[str]):
        names = [g for g in globs if "/" not in g]
        paths = [g for g in globs if "/" in g]
        # Public so a per-entry loop can call the regex directly (one call instead of two).
        self.name_match = re.compile("|".join(fnmatch.translate(g) for g in names)).match if names else None
        self.path_match = re.compile("|".join(fnmatch.translate(g) for g in paths)).match if paths else None
        self.everything = "*" in names

    def __call__(self, name: str, relpath: str) -> bool:
        if self.everything:
            return True
        return bool((self.name_match is not None and self.name_match(name))
                    or (self.path_match is not None and self.path_match(relpath)))


_GLOBSETS: dict[tuple[str, ...], GlobSet] = {}


def globset(globs: Sequence[str]) -> GlobSet:
    key = tuple(globs)
    found = _GLOBSETS.get(key)
    if found is None:
        found = _GLOBSETS[key] = GlobSet(key)
    return found


Sized = TypeVar("Sized")  # anything with .bytes: a Candidate, a detached hub revision


def oldest_until(oldest_first: Sequence[Sized], need: int) -> list[Sized]:
    """The oldest entries, in order, until they free `need` bytes (a watermark's or a size cap's need)."""
    out, total = [], 0
    for item in oldest_first:
        if total >= need:
            break
        out.append(item)
        total += item.bytes
    return out


def freed_bytes(st: os.stat_result) -> int:
    # Deleting one name of a multi-linked file frees nothing; st_blocks is what df sees.
    return st.st_blocks * 512 if st.st_nlink <= 1 else 0


# ---------------------------------------------------------------- checkpoints

_STEP_KEYWORDS = (
    re.compile(r"(?:global_step|step|steps)[-_=]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:iteration|iter|it)[-_=]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:epoch|ep)[-_=]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:checkpoint|ckpt)[-_=]?(\d+)", re.IGNORECASE),
)
_SHARD = re.compile(r"-\d+-of-\d+$")


def parse_step(name: str) -> int | None:
    """Training step (or epoch) from a checkpoint name; None when the name does not say.

    "checkpoint-1500" -> 1500, "epoch=3-step=1500.ckpt" -> 1500, "model_120.pth" -> 120,
    "model_best.pth" -> None, "run3_epoch10.pth" -> 10; two unlabelled numbers -> None.
    """
    stem = name
    for _ in range(2):  # model.pt, model.tar.gz-like double suffixes
        base, ext = os.path.splitext(stem)
        if ext and not ext[1:].isdigit():
            stem = base
    stem = _SHARD.sub("", stem)
    for pattern in _STEP_KEYWORDS:
        found = pattern.findall(stem)
        if found:
            return int(found[-1])
    numbers = re.findall(r"\d+", stem)
    return int(numbers[0]) if len(numbers) == 1 else None


@dataclass(frozen=True, slots=True)
class CheckpointItem:
    group: str  # the run directory, relative to the root
    relpath: str
    name: str
    step: int | None
    mtime: float
    bytes: int
    files: int
    is_unit: bool
    dev: int
    ino: int
    busy: bool  # being written: changed within grace, or open by a process


def select_checkpoints(
    root: str, items: Iterable[CheckpointItem], policy: CheckpointsPolicy, now: float
) -> list[Candidate]:
    """Apply keep_last / keep_every / older_than per run group. Pure."""
    groups: dict[str, list[CheckpointItem]] = {}
    for item in items:
        groups.setdefault(item.group, []).append(item)
    out: list[Candidate] = []
    for members in groups.values():
        out.extend(_select_group(root, members, policy, now))
    out.sort(key=lambda c: c.age_ts)
    return out


def _select_group(root: str, members: list[CheckpointItem], policy: CheckpointsPolicy, now: float) -> list[Candidate]:
    # A checkpoint still being written does not count as one of the kept: if the run
    # dies mid-save, keep_last complete checkpoints remain.
    complete = [m for m in members if not m.busy]
    if not complete:
        return []
    by_step = all(m.step is not None for m in complete)
    if by_step:
        ordered = sorted(complete, key=lambda m: (m.step, m.mtime), reverse=True)
    else:
        ordered = sorted(complete, key=lambda m: m.mtime, reverse=True)
    # Among equal mtimes the highest step counts as the newest (max keeps the first maximum).
    newest_by_time = max(ordered, key=lambda m: m.mtime)
    out = []
    for rank, item in enumerate(ordered, start=1):
        if rank <= policy.keep_last or item is newest_by_time:
            continue
        if policy.keep_every and item.step is not None and item.step % policy.keep_every == 0:
            continue
        age = now - item.mtime
        if policy.older_than is not None and age < policy.older_than:
            continue
        label = f"step {item.step}" if by_step else f"modified {format_duration(age)} ago"
        reason = f"keep_last={policy.keep_last}: #{rank} newest in {item.group or '.'} ({label})"
        if policy.older_than is not None:
            reason += f", older than {format_duration(policy.older_than)}"
        out.append(Candidate(root, item.relpath, item.dev, item.ino, item.bytes, item.files, item.is_unit, item.mtime, reason))
    # Oldest first, so the caller's stable sort by age keeps step order among equal mtimes
    # (checkpoints saved within one timestamp tick).
    out.reverse()
    return out


# ---------------------------------------------------------------- age and caches


def age_timestamp(st: os.stat_result, age_by: Sequence[str]) -> float:
    """The newest of the configured timestamps (systemd-tmpfiles judges by all three)."""
    ts = 0.0
    for field in age_by:
        ts = max(ts, getattr(st, "st_" + field))
    return ts


@dataclass(frozen=True, slots=True)
class CacheKind:
    unit_globs: tuple[str, ...]  # top-level directories deleted as one entry
    exclude: tuple[str, ...]  # never deleted
    lock_globs: tuple[str, ...]  # open by a process -> the cache is in use


CACHE_KINDS: Mapping[str, CacheKind] = {
    "pip-cache": CacheKind((), ("selfcheck", "selfcheck/*", "*.lock"), ("*.lock",)),
    "huggingface-cache": CacheKind(
        ("models--*", "datasets--*", "spaces--*"), (".locks", "version*.txt", "token", "stored_tokens", "*.lock"),
        ("*.lock",)),
    # datasets: each top-level directory (a dataset's prepared configs and versions; downloads/)
    # is one unit, so a dataset never loses some of its arrow files and keeps the others.
    "huggingface-datasets-cache": CacheKind(("[!.]*",), ("*.lock", ".locks"), ("*.lock",)),
    "torch-cache": CacheKind(("*_*",), ("trusted_list", "*.lock"), ("*.lock",)),
    "conda-cache": CacheKind(("*-*-*",), ("urls", "urls.txt", "*.lock", ".conda_lock"), ("*.lock", ".conda_lock")),
}


def cache_dirs(
    kind: str,
    environ: Mapping[str, str],
    homes: Sequence[str],
    *,
    as_root: bool,
    own_home: str,
) -> list[str]:
    """Where the tool keeps its cache: its env var first, then XDG, then ~/.cache; every home when root.

    The daemon's environment describes only its own user; other users' caches are
    found at their default place under their home.
    """
    def xdg(home: str, env: Mapping[str, str]) -> str:
        return env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")

    def for_home(home: str, env: Mapping[str, str]) -> list[str]:
        if kind == "pip-cache":
            return [env.get("PIP_CACHE_DIR") or os.path.join(xdg(home, env), "pip")]
        if kind == "huggingface-cache":
            # The hub cache (repos) and the xet chunk cache (content-addressed: any chunk may go).
            hf_home = env.get("HF_HOME") or os.path.join(xdg(home, env), "huggingface")
            hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(hf_home, "hub")
            return [hub, env.get("HF_XET_CACHE") or os.path.join(hf_home, "xet")]
        if kind == "huggingface-datasets-cache":
            hf_home = env.get("HF_HOME") or os.path.join(xdg(home, env), "huggingface")
            return [env.get("HF_DATASETS_CACHE") or os.path.join(hf_home, "datasets")]
        if kind == "torch-cache":
            torch_home = env.get("TORCH_HOME") or os.path.join(xdg(home, env), "torch")
            return [os.path.join(torch_home, "hub")]
        if kind == "conda-cache":
            dirs = [d for d in env.get("CONDA_PKGS_DIRS", "").split(",") if d]
            return dirs or [os.path.join(home, ".conda", "pkgs"), os.path.join(home, "miniconda3", "pkgs"),
                            os.path.join(home, "anaconda3", "pkgs")]
        raise ValueError(f"unknown cache kind {kind!r}")

    found = for_home(own_home, environ)
    if kind == "conda-cache":
        found += [os.path.join(environ.get("CONDA_ROOT", "/opt/conda"), "pkgs")]
    if as_root:
        for home in homes:
            found += for_home(home, {})
    seen, out = set(), []
    for path in found:
        norm = os.path.normpath(path)
        if norm not in seen:
            seen.add(norm)
            out.append(norm)
    return out


def age_reason(policy: AgePolicy | CachePolicy, watermark: bool) -> str:
    """One reason per run (the entry's own age is in the item): cheap for a million files."""
    by = "/".join(policy.age_by) if isinstance(policy, AgePolicy) else "atime/mtime"
    if watermark:
        return f"{policy.type}: oldest first until the {policy.low:.0%} watermark (unused by {by})"
    return f"{policy.type}: unused for more than {format_duration(policy.older_than)} (by {by})"
