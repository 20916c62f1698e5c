"""The interface every cleanup kind implements, and the context one policy run hands it.

A kind (checkpoints, age, the caches; later logs rotation) is two steps behind one
interface, registered by policy type in runner.KINDS:

    plan(ctx, root, need)   -> Planned: what would go on this root (counts for max_delete)
    execute(ctx, root, planned, need): delete it, re-checking every entry just before

`need` is the bytes a watermark run must free on the root's filesystem (None: take every
candidate). A plan has two parts, judged differently by max_delete (guard.py): every due entry of
a plain run (files, bytes), which the guard refuses whole when it is too much (ctx.refused: execute
skips it), and what freeing a watermark's or a size cap's need takes, oldest first (need_files,
need_bytes), which max_delete only bounds: execute deletes it up to the bound, never nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.engine.bound import NO_LIMIT, Bound
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.record.report import Tally
from trainguard.actions.cleanup.safety.inuse import OpenFiles
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.sources.fs import usage_from_statvfs


@dataclass(frozen=True, slots=True)
class Tools:
    """What a runner lends every run: open-file index, audit log, clock, test hook, mirrors."""

    open_files: OpenFiles
    audit: AuditLog | None = None
    clock: Callable[[], float] = time.time
    hook: walker.Hook | None = None
    mirrors: dict = field(default_factory=dict)  # name -> config Mirror
    mirror_timeout: float = 10.0


@dataclass(slots=True)
class Ctx:
    """One run of one policy."""

    policy: Any
    tally: Tally
    tools: Tools
    dry_run: bool
    now: float
    refused: bool = False  # max_delete refused the plain part of this run (guard.max_delete_guard)
    whole: tuple[str, int, float] | None = None  # an emergency's unit taken past max_delete (engine/bound.py)

    def skip_error(self, path: str, exc: OSError) -> None:
        self.tally.skip_error(path, exc, walker.classify_error)

    def skip_open(self, path: str, inodes) -> None:
        of = self.tools.open_files
        self.tally.skip_open(path, of.holder(inodes), of.describe)

    def went(self, root: Root, path: str, size: tuple[int, int], reason: str, age: float,
             unit: bool = False) -> None:
        """An entry deleted (or, in a dry run, that would be), size = (bytes, files): audit it, count it."""
        nbytes, files = size
        if not self.dry_run and self.tools.audit is not None:
            self.tools.audit.record(self.policy.name, root.mount, path, nbytes, files, reason)
        self.tally.deleted(path, nbytes, files, reason, age, unit)

    def went_files(self, root: Root, parent: str, files: list[tuple[str, int, float]], reason: str) -> None:
        """went() for single files gone from the directory parent (a full path): (name, bytes, age) each."""
        if not self.dry_run and self.tools.audit is not None:
            self.tools.audit.record_files(self.policy.name, root.mount, parent, files, reason)
        self.tally.deleted_files(parent, files, reason)

    def left(self, need: int = NO_LIMIT) -> Bound:
        """What max_delete still allows this run, every root so far counted (need: a need's bytes)."""
        return Bound.left(self.policy.max_delete, self.tally.files, self.tally.bytes, need)

    def take_whole(self, root: Root, relpath: str, files: int, delete: Callable[[], int | None]) -> int:
        """An emergency's first unit, past what max_delete allows (engine/bound.py): delete() takes it
        whole and returns the bytes freed; the run then says so."""
        used = usage_from_statvfs(os.fstatvfs(root.fd)).used_ratio
        before = self.tally.files
        freed = delete()
        if self.tally.files > before:
            self.whole = (relpath, files, used)
        return freed or 0

    def before_delete(self, relpath: str) -> None:
        if self.tools.hook is not None:
            self.tools.hook("before_delete", relpath)


@dataclass(slots=True)
class Planned:
    files: int = 0  # every due entry of a plain run: all or nothing under max_delete
    bytes: int = 0
    note: str = ""  # non-empty: nothing is done on this root, and why
    data: Any = None  # the kind's own plan
    need_files: int = 0  # what freeing a watermark's or a size cap's need takes, oldest first (an
    need_bytes: int = 0  # estimate past max_delete): bounded by max_delete, never refused


class Kind(Protocol):
    def plan(self, ctx: Ctx, root: Root, need: int | None) -> Planned: ...

    def execute(self, ctx: Ctx, root: Root, planned: Planned, need: int | None) -> None: ...


def full_path(root: Root, relpath: str) -> str:
    return os.path.join(root.path, relpath) if relpath else root.path
