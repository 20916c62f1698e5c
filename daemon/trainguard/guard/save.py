"""A checkpoint save that a full disk or a crash cannot tear.

1. check: will it fit (the previous checkpoint's size unless told), keeping the reserve free?
   If not, checkpoints that keep_last would delete after this save anyway (never the newest)
   are deleted first to make room; still not: CheckpointWontFit, or the fallback directory.
2. write to ".<name>.tg-tmp-<pid>-<random>" in the same directory, fsync the data;
3. rename over the final name (atomic), fsync the directory;
4. only now apply keep_last: the newest good checkpoint is never deleted before its
   successor is complete and durable.
A write that runs out of space removes its temporary file and raises CheckpointWontFit.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections import namedtuple

from trainguard.guard import events
from trainguard.guard.space import (
    TEMP_MARK,
    CheckpointWontFit,
    Fit,
    Reserve,
    checkpoint_patterns,
    list_checkpoints,
    tree_bytes,
    will_fit,
)

_FULL = (errno.ENOSPC, errno.EDQUOT)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


class Saved(namedtuple("Saved", "path bytes removed fallback", defaults=((), False))):
    """What save_checkpoint() did: path (where the checkpoint is now: the fallback directory's copy
    when it fell back), bytes, removed ((path, bytes) keep_last deleted), fallback."""

    __slots__ = ()


class _Sink(io.FileIO):
    """The temporary file: counts bytes and remembers a full disk even when the writer
    (torch's zip writer, say) turns the OSError into its own exception."""

    written = 0
    full: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            n = super().write(data)
        except OSError as exc:
            if exc.errno in _FULL:
                self.full = exc
            raise
        self.written += n or 0
        return n


def _writer_for(obj: Any, save_fn: Callable[[Any, Any], Any] | None) -> Callable[[Any], Any]:
    if save_fn is not None:
        return lambda target: save_fn(obj, target)
    if callable(obj):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return lambda f: f.write(obj)
    raise TypeError("save_checkpoint needs a writer (a callable taking a file object or path), bytes, "
                    "or an object with save_fn=, e.g. save_checkpoint(state, path, save_fn=torch.save)")


def _was_full(exc: BaseException, sink: _Sink | None) -> bool:
    if sink is not None and sink.full is not None:
        return True
    seen = 0
    while exc is not None and seen < 10:  # torch wraps the OSError; look down the chain
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file and directory of a directory checkpoint (the writer closed them, unsynced)."""
    for here, dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(here, name)
            if os.path.islink(full):
                continue
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(here)


def remove(path: str) -> None:
    """A file, or a directory tree (rmtree never follows symlinks out of it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil  # here: shutil's import pulls in three compression modules

        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(directory: str, name: str) -> None:
    """Temporaries of an earlier save of this name whose process is gone (killed mid-write)."""
    prefix = f".{name}{TEMP_MARK}"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return
    for leftover in names:
        pid = leftover[len(prefix):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            remove(os.path.join(directory, leftover))


def _doomed(path: str, keep_last: int | None, *, spare_newest: bool = False) -> list[tuple[str, os.stat_result]]:
    """Checkpoints keep_last deletes once a new one is in place (oldest first); with spare_newest,
    never the newest of them (before the save it is the last good checkpoint)."""
    if not keep_last:
        return []
    final = os.path.abspath(path)
    found = [(p, st) for p, st in list_checkpoints(os.path.dirname(final), checkpoint_patterns(final))
             if p != final]
    doomed = found[:max(0, len(found) - (keep_last - 1))]
    return doomed[:len(found) - 1] if spare_newest else doomed


def _make_room(fit: Fit, path: str, keep_last: int | None) -> tuple[Fit, list[tuple[str, int]]]:
    """Delete what keep_last would delete after the save anyway, oldest first, until it fits;
    never the newest existing checkpoint nor the one about to be overwritten, and nothing at all
    when even all of them would not make room (the save is refused with every checkpoint kept)."""
    if fit.fits:
        return fit, []
    chosen, freed = [], 0
    for old, st in _doomed(path, keep_last, spare_newest=True):
        chosen.append((old, tree_bytes(old, st)))
        freed += chosen[-1][1]
        if fit.avail + freed >= fit.need + fit.reserve:
            break
    else:
        return fit, []
    for old, _size in chosen:
        remove(old)
    return will_fit(path, fit.need, fit.reserve), chosen


def _write_temp(writer: Callable[[Any], Any], final: str, as_dir: bool, pass_path: bool) -> str:
    directory, name = os.path.split(final)
    temp = os.path.join(directory, f".{name}{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}")
    sink = None
    try:
        if as_dir:
            os.mkdir(temp, 0o755)
            writer(temp)
            fsync_tree(temp)
        elif pass_path:
            writer(temp)
            fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            sink = _Sink(fd, "wb")
            with io.BufferedWriter(sink, 1 << 20) as f:
                writer(f)
                f.flush()
                os.fsync(sink.fileno())
        return temp
    except BaseException as exc:
        written = sink.written if sink is not None else (tree_bytes(temp) if os.path.lexists(temp) else 0)
        remove(temp)
        if isinstance(exc, Exception) and _was_full(exc, sink):
            st = os.statvfs(directory)
            raise CheckpointWontFit(final, written, st.f_bavail * st.f_frsize, 0, written=written) from exc
        raise


def _install(temp: str, final: str, as_dir: bool) -> None:
    """Atomic rename; a directory replacing a directory goes through an aside name (rename(2)
    cannot replace a non-empty one), so the final name is never a mix of old and new."""
    directory = os.path.dirname(final)
    if as_dir and os.path.isdir(final) and not os.path.islink(final):
        aside = f"{temp}.old"
        os.rename(final, aside)
        os.rename(temp, final)
        fsync_dir(directory)
        remove(aside)
    else:
        os.replace(temp, final)
        fsync_dir(directory)


def _choose_target(final: str, fit: Fit, fallback_dir, reserve: Reserve,
                   state_dir: str | None) -> tuple[str, Fit, bool]:
    """Where the save goes: (path, its Fit, whether that is the fallback directory). Raises
    CheckpointWontFit, reported to the daemon, when it fits in neither place."""
    if fit.fits:
        return final, fit, False
    exc = fit.error()
    if fallback_dir is not None:
        elsewhere = os.path.join(os.path.abspath(os.fspath(fallback_dir)), os.path.basename(final))
        other = will_fit(elsewhere, fit.need, reserve)
        if other.fits:
            os.makedirs(os.path.dirname(elsewhere), exist_ok=True)
            return elsewhere, other, True
        exc.args = (exc.errno, f"{exc}; nor in the fallback directory: {other.error()}")
    events.report("wont-fit", final, state_dir=state_dir, bytes=fit.need, avail=fit.avail, reserve=fit.reserve,
                  message=str(exc))
    raise exc


def save_checkpoint(
    obj_or_writer: Any,
    path: str | os.PathLike[str],
    *,
    keep_last: int | None = None,
    save_fn: Callable[[Any, Any], Any] | None = None,
    nbytes: int | None = None,
    reserve: Reserve = None,
    fallback_dir: str | os.PathLike[str] | None = None,
    directory: bool = False,
    pass_path: bool = False,
    state_dir: str | None = None,
) -> Saved:
    """Save a checkpoint atomically; see the module docstring.

    obj_or_writer: a callable that writes to the file object it is given
    (``lambda f: torch.save(state, f)``), or to the path it is given with pass_path=True or
    directory=True (``model.save_pretrained``); bytes; or any object together with
    save_fn=torch.save. nbytes: the expected size (default: the previous checkpoint's).
    keep_last: keep this many checkpoints of the same name family ("model_*.pt",
    "checkpoint-*") in the directory, the new one included.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    writer = _writer_for(obj_or_writer, save_fn)
    final = os.path.abspath(os.fspath(path))
    as_dir = directory or (os.path.isdir(final) and not os.path.islink(final))
    fit = will_fit(final, nbytes, reserve)
    fit, removed = _make_room(fit, final, keep_last)
    final, fit, fell_back = _choose_target(final, fit, fallback_dir, reserve, state_dir)
    remove_stale_temps(os.path.dirname(final), os.path.basename(final))
    try:
        temp = _write_temp(writer, final, as_dir, pass_path)
    except CheckpointWontFit as exc:
        events.report("wont-fit", final, state_dir=state_dir, bytes=exc.written or 0, avail=exc.avail,
                      reserve=fit.reserve, removed=tuple(removed), message=str(exc))
        raise
    _install(temp, final, as_dir)
    size = tree_bytes(final)
    if not fell_back:
        removed += [(old, _remove_counted(old, st)) for old, st in _doomed(final, keep_last)]
    kind = "fallback" if fell_back else "saved"
    message = f"saved in the fallback directory: {fit.path}" if fell_back else ""
    events.report(kind, final, state_dir=state_dir, bytes=size, avail=will_fit(final, 0, 0).avail,
                  reserve=fit.reserve, removed=tuple(removed), message=message)
    return Saved(final, size, tuple(removed), fell_back)


def _remove_counted(path: str, st: os.stat_result) -> int:
    size = tree_bytes(path, st)
    remove(path)
    return size
