"""Plan a round: walk the local source, keep the files the patterns select, and compare each with the record.

Only the local disk is read here; the share is never touched (a stat there may hang the caller).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Callable, Mapping

from trainguard.actions.mirror.record import Entry

TEMP_MARK = ".trainguard-tmp-"  # in the temporary names the copier writes on the share


@dataclass(frozen=True, slots=True)
class LocalFile:
    rel: bytes  # relative to source
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Job:
    """One file to bring to the share."""

    rel: bytes
    size: int  # as planned; the copier copies what is there when it opens the file
    mtime_ns: int
    dirty_since: float


@dataclass(frozen=True, slots=True)
class Plan:
    jobs: tuple[Job, ...]
    gone: tuple[bytes, ...]  # recorded files no longer in the source
    files: int  # files selected by the patterns
    error: str = ""  # the source could not be read (then nothing is planned or forgotten)


def walk(source: str, selected: Callable[[str], bool]) -> tuple[list[LocalFile], list[str]]:
    """Regular files below source that the patterns select; symlinks are not followed, mounts not crossed."""
    root = os.fsencode(source)
    files: list[LocalFile] = []
    problems: list[str] = []
    root_dev = os.stat(root).st_dev
    stack = [b""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
                entries = list(it)
        except OSError as exc:
            problems.append(f"{os.fsdecode(os.path.join(root, rel_dir))}: {exc.strerror}")
            continue
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished between the listing and the stat
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev == root_dev:
                    stack.append(rel)
            elif stat.S_ISREG(st.st_mode) and TEMP_MARK.encode() not in entry.name and selected(os.fsdecode(rel)):
                files.append(LocalFile(rel, st.st_size, st.st_mtime_ns))
    return files, problems


def plan(files: list[LocalFile], entries: Mapping[bytes, Entry], now: float, created: float) -> Plan:
    """Jobs for the files whose size or mtime differ from their last copy, oldest change first."""
    jobs = []
    for f in files:
        entry = entries.get(f.rel)
        copied = entry.copied if entry else None
        if copied is not None and (copied.size, copied.mtime_ns) == (f.size, f.mtime_ns):
            continue
        since = entry.dirty_since if entry and entry.dirty_since is not None else None
        if since is None:
            # Changed while nobody watched: since its mtime, but a newly configured mirror starts its clock now.
            since = max(min(now, f.mtime_ns / 1e9), created)
        jobs.append(Job(f.rel, f.size, f.mtime_ns, since))
    present = {f.rel for f in files}
    gone = tuple(rel for rel in entries if rel not in present)
    jobs.sort(key=lambda j: (j.dirty_since, j.rel))
    return Plan(tuple(jobs), gone, len(files))
