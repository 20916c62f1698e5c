"""Will the next checkpoint fit? statvfs (df's "avail"), a reserve, and the size of the previous one.

The reserve is what must stay free after the save, so the trainer's logs, the data loader's
temp files and the next step still have room: an int (bytes), "2GiB", "5%" (of the filesystem)
or a ratio below 1. Default: $TRAINGUARD_RESERVE, else 1% of the filesystem, at most 1 GiB.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections import namedtuple

from trainguard.units import format_bytes, parse_bytes, parse_ratio

ENV_RESERVE = "TRAINGUARD_RESERVE"
DEFAULT_RESERVE_RATIO = 0.01
DEFAULT_RESERVE_CAP = 1 << 30
# The names the checkpoints cleanup policy knows (config.cleanup), files and directory units.
CHECKPOINT_FILES = ("*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.bin")
CHECKPOINT_DIRS = ("checkpoint-*", "global_step*")
TEMP_MARK = ".tg-tmp-"  # our temporary names: ".<final name>.tg-tmp-<pid>-<random>"

Reserve = int | float | str | None
_DIGITS = re.compile(r"\d+")


class CheckpointWontFit(OSError):
    """The checkpoint does not fit on the filesystem while keeping the reserve free.

    Raised before anything is written (from the estimate) or after a write ran out of space
    (the temporary file is already gone); the previous checkpoints are untouched either way.
    """

    def __init__(self, path: str, need: int, avail: int, reserve: int, *, written: int | None = None):
        self.path, self.need, self.avail, self.reserve, self.written = path, need, avail, reserve, written
        if written is None:
            what = (f"needs {format_bytes(need)} + reserve {format_bytes(reserve)}, "
                    f"only {format_bytes(avail)} available")
        else:
            what = f"the disk filled after {format_bytes(written)} were written ({format_bytes(avail)} left)"
        super().__init__(28, f"checkpoint {path} will not fit: {what}")  # errno 28: ENOSPC

    def __str__(self) -> str:
        return self.args[1]


class Fit(namedtuple("Fit", "path need avail reserve size previous", defaults=(None,))):
    """The answer of will_fit(), true when the bytes fit with the reserve left over: path, need
    (bytes the save is expected to take; 0: nothing to go by), avail (bytes available to
    unprivileged writers now, df's Avail), reserve (bytes that must stay free afterwards), size
    (the filesystem's), previous (the checkpoint `need` was taken from). A named tuple: see
    guardspool.GuardEvent."""

    __slots__ = ()

    @property
    def fits(self) -> bool:
        return self.need + self.reserve <= self.avail

    @property
    def short_by(self) -> int:
        return max(0, self.need + self.reserve - self.avail)

    def __bool__(self) -> bool:
        return self.fits

    def error(self) -> CheckpointWontFit:
        return CheckpointWontFit(self.path, self.need, self.avail, self.reserve)


def existing_dir(path: str) -> str:
    """The directory a new file at path would land in, or path itself when it is a directory;
    walks up to the nearest one that exists (statvfs needs something real)."""
    path = os.path.abspath(path)
    here = path if os.path.isdir(path) else os.path.dirname(path)
    while not os.path.isdir(here):
        here = os.path.dirname(here)
    return here


def reserve_bytes(reserve: Reserve, fs_size: int) -> int:
    if reserve is None:
        env = os.environ.get(ENV_RESERVE, "").strip()
        if not env:
            return min(DEFAULT_RESERVE_CAP, int(fs_size * DEFAULT_RESERVE_RATIO))
        reserve = env
    if isinstance(reserve, float) and not reserve.is_integer() or isinstance(reserve, str) and reserve.strip().endswith("%"):
        return int(fs_size * parse_ratio(reserve))
    try:
        return parse_bytes(reserve)
    except ValueError as exc:
        source = f"{ENV_RESERVE}: " if isinstance(reserve, str) and reserve == os.environ.get(ENV_RESERVE, "").strip() else ""
        raise ValueError(f"{source}reserve {exc} (or a percentage of the filesystem like \"5%\")") from None


def family_pattern(name: str) -> str:
    """The glob a checkpoint's siblings share: digit runs become *, so "model_12.pt" ->
    "model_*.pt" and "checkpoint-500" -> "checkpoint-*"; a name without digits stands alone."""
    return _DIGITS.sub("*", name.replace("[", "[[]"))


def step_of(name: str) -> int | None:
    numbers = _DIGITS.findall(name)
    return int(numbers[-1]) if numbers else None


def checkpoint_patterns(target: str) -> tuple[str, ...]:
    """What counts as "a previous checkpoint" for target: its family when target names a file
    or a checkpoint directory, else every checkpoint name the cleanup policy knows."""
    if os.path.isdir(target) and not any(fnmatch.fnmatchcase(os.path.basename(target), p) for p in CHECKPOINT_DIRS):
        return CHECKPOINT_FILES + CHECKPOINT_DIRS
    return (family_pattern(os.path.basename(os.path.normpath(target))),)


def list_checkpoints(directory: str, patterns: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    """Checkpoints in directory (no temporaries, no symlinks), oldest first: by step number when
    every name has one, else by modification time."""
    found = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    found.append((entry.path, st))
    except OSError:
        return []
    steps = [step_of(os.path.basename(p)) for p, _ in found]
    if found and None not in steps:
        order = sorted(range(len(found)), key=lambda i: (steps[i], found[i][1].st_mtime_ns))
    else:
        order = sorted(range(len(found)), key=lambda i: (found[i][1].st_mtime_ns, found[i][0]))
    return [found[i] for i in order]


def allocated(st: os.stat_result) -> int:
    return max(st.st_size, st.st_blocks * 512)


def tree_bytes(path: str, st: os.stat_result | None = None) -> int:
    """Bytes a file or a directory checkpoint takes (symlinks and other filesystems not followed)."""
    st = st or os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return allocated(st)
    total, stack = allocated(st), [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        est = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if est.st_dev != st.st_dev:
                        continue
                    total += allocated(est)
                    if stat.S_ISDIR(est.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def previous_checkpoint(target: str) -> tuple[str, int] | None:
    """(path, bytes) of the newest checkpoint next to target (or inside it, when target is the
    run's output directory); None when there is none yet."""
    target = os.path.abspath(target)
    is_container = os.path.isdir(target) and len(checkpoint_patterns(target)) > 1
    directory = target if is_container else os.path.dirname(target)
    found = list_checkpoints(directory, checkpoint_patterns(target))
    if not found:
        return None
    path, st = found[-1]
    return path, tree_bytes(path, st)


def will_fit(path: str | os.PathLike[str], nbytes: int | None = None, reserve: Reserve = None) -> Fit:
    """Will nbytes fit on the filesystem of path, keeping the reserve free?

    path is where the checkpoint goes (a file or directory name, need not exist yet) or the
    run's output directory. nbytes defaults to the size of the previous checkpoint there.
    """
    target = os.fspath(path)
    where = existing_dir(target)
    st = os.statvfs(where)
    size = st.f_blocks * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    previous = None
    if nbytes is None:
        found = previous_checkpoint(target)
        previous, nbytes = found if found is not None else (None, 0)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return Fit(os.path.abspath(target), int(nbytes), avail, reserve_bytes(reserve, size), size, previous)
