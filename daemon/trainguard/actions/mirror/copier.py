"""The copier: a child process that writes files to the share; `python -S copier.py` (it is its own script).

It reads one JSON job list on stdin and reports on stdout, one JSON line per event, before every
operation on the share that may block ("op") and after every step that moved ("bytes", "done"), so
its supervisor can tell a hung share from a slow one and kill it. Standard library only, and few modules:
it starts in a few tens of milliseconds.

A file is copied to `.<name>.trainguard-tmp-<random>` in its destination directory, given the
source's mode and mtime, fsynced and renamed over the final name: the final name holds the old
copy or the new one, never a torn one, even when the copier is killed half-way. A file that grew
(an event file) is copied whole again the same way, as `rsync -a` does for a local copy: appending
in place would leave a half-written record under the final name whenever an append is cut short.
Nothing on the share is ever deleted except this copier's own temporary files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import threading
import time

CHUNK = 8 * 2**20
WINDOW = 64 * 2**10
PROGRESS_EVERY = 0.25  # seconds between "bytes" lines
FLUSH_EVERY = 0.05  # seconds between writes of the queued report lines
WORKERS = 4  # files copied at once: a share's per-file latency (create, fsync, rename) overlaps
FATAL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENOTCONN, errno.ESTALE, errno.EIO, errno.ETIMEDOUT,
         errno.EHOSTDOWN, errno.ENODEV}  # the share as a whole is unusable: stop the round


_worker = threading.local()  # .index: the copy thread's number, in its report lines


class SourceChanged(Exception):
    """The local file shrank or was rewritten while it was copied."""


class Emitter:
    """Report lines, written by a flusher thread every FLUSH_EVERY: a line queued just before a call that
    blocks on the share still reaches the supervisor (the blocked call holds no lock), and a round of
    thousands of small files does not pay a write per line."""

    def __init__(self, out=sys.stdout):
        self.out = out
        self._last = 0.0
        self._bytes = 0
        self._lock = threading.Lock()
        self._queue: list[str] = []
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self._flusher.start()

    def __call__(self, **event) -> None:
        w = getattr(_worker, "index", None)
        if w is not None:  # which copy thread: the supervisor times each thread's open operation on its own
            event["w"] = w
        line = json.dumps(event) + "\n"
        with self._lock:
            self._queue.append(line)

    def flush(self) -> None:
        with self._lock:
            lines, self._queue = self._queue, []
        if lines:
            self.out.write("".join(lines))
            self.out.flush()

    def close(self) -> None:
        self._closed.set()
        self._flusher.join()
        self.flush()

    def _flush_loop(self) -> None:
        while not self._closed.wait(FLUSH_EVERY):
            self.flush()

    def op(self, name: str, path: str) -> None:
        self(ev="op", op=name, path=path)

    def moved(self, n: int) -> None:
        with self._lock:
            self._bytes += n
            now = time.monotonic()
            if now - self._last < PROGRESS_EVERY:
                return
            n, self._bytes, self._last = self._bytes, 0, now
        self(ev="bytes", n=n)


def window_digest(fd: int, size: int) -> str:
    """The first and last 64 KiB of the first `size` bytes: enough to tell an appended file from a rewritten one."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    h.update(os.pread(fd, min(WINDOW, size), 0))
    if size > WINDOW:
        h.update(os.pread(fd, WINDOW, max(WINDOW, size - WINDOW)))
    return h.hexdigest()


def copy_range(src: int, dst: int, start: int, end: int, emit: Emitter) -> None:
    """Bytes [start, end) of src to the same offsets of dst: in-kernel copy, else sendfile, else read/write."""
    offset, how = start, "range"
    while offset < end:
        count = min(CHUNK, end - offset)
        try:
            if how == "range":
                n = os.copy_file_range(src, dst, count, offset, offset)
            elif how == "sendfile":
                n = os.sendfile(dst, src, offset, count)
            else:
                data = os.pread(src, count, offset)
                n = os.pwrite(dst, data, offset) if data else 0
        except OSError as exc:
            if how != "plain" and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                how = "sendfile" if how == "range" else "plain"
                if how == "sendfile":
                    os.lseek(dst, offset, os.SEEK_SET)
                continue
            raise
        if n == 0:
            raise SourceChanged("the local file shrank while it was copied")
        offset += n
        emit.moved(n)


def temp_name(final: str) -> str:
    base = os.path.basename(final)[:200]
    return os.path.join(os.path.dirname(final), f".{base}.trainguard-tmp-{os.urandom(4).hex()}")


class Copier:
    def __init__(self, source: str, dest: str, emit: Emitter):
        self.source, self.dest, self.emit = source, dest, emit
        self._dirs: set[str] = set()

    def run(self, jobs: list[dict], temps: list[str], workers: int = WORKERS) -> None:
        for tmp in temps:
            self.remove_temp(tmp)
        self.emit(ev="ready")  # the earlier copies' temporary files are dealt with
        self._abort = threading.Event()
        todo = iter(jobs)  # next() on a list iterator is atomic: each job goes to one thread

        def work(index: int) -> None:
            _worker.index = index
            for job in todo:
                self.one(job)

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(min(workers, len(jobs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def one(self, job: dict) -> None:
        if self._abort.is_set():
            return
        rel = job["rel"]
        try:
            self.emit(ev="done", rel=rel, **self.copy(rel))
        except SourceChanged as exc:
            self.emit(ev="changed", rel=rel, error=str(exc))
        except FileNotFoundError as exc:
            if exc.filename and os.fsdecode(exc.filename).startswith(self.source.rstrip("/") + "/"):
                self.emit(ev="vanished", rel=rel)
                return
            self.fail(rel, exc)
        except OSError as exc:
            self.fail(rel, exc)
            if exc.errno in FATAL:  # the share as a whole is unusable: the other files would fail the same way
                self._abort.set()

    def fail(self, rel: str, exc: OSError) -> None:
        self.emit(ev="fail", rel=rel, errno=exc.errno, error=exc.strerror or str(exc),
                  path=os.fsdecode(exc.filename) if exc.filename else "")

    def remove_temp(self, tmp: str) -> None:
        path = os.path.join(self.dest, tmp)
        self.emit.op("unlink", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return
        self.emit(ev="temp_gone", tmp=tmp)

    def copy(self, rel: str) -> dict:
        src = os.open(os.path.join(self.source, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(src)
            digest = window_digest(src, st.st_size)

            def unchanged() -> None:
                # Bytes appended during the copy are the next round's; a shrunk or rewritten file is a torn copy.
                if os.fstat(src).st_size < st.st_size or window_digest(src, st.st_size) != digest:
                    raise SourceChanged("the local file was rewritten while it was copied")

            self.replace(src, st, rel, unchanged)
        finally:
            os.close(src)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest}

    def _dest_dir(self, final: str) -> None:
        parent = os.path.dirname(final)
        if parent not in self._dirs:
            self.emit.op("mkdir", parent)
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)

    def replace(self, src: int, st: os.stat_result, rel: str, unchanged) -> None:
        final = os.path.join(self.dest, rel)
        self._dest_dir(final)
        tmp = temp_name(final)
        self.emit(ev="tmp", tmp=os.path.relpath(tmp, self.dest))  # before it exists: a kill cannot hide it
        self.emit.op("create", tmp)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            self.emit.op("write", tmp)
            copy_range(src, out, 0, st.st_size, self.emit)
            self._finish(out, st, tmp)
            unchanged()  # before the rename: a torn copy never gets the final name
        except BaseException:
            os.close(out)
            self.remove_temp(os.path.relpath(tmp, self.dest))
            raise
        os.close(out)
        self.emit.op("rename", final)
        os.rename(tmp, final)

    def _finish(self, out: int, st: os.stat_result, path: str) -> None:
        self.emit.op("utime", path)
        try:
            os.fchmod(out, st.st_mode & 0o7777)
        except OSError:
            pass  # a share that keeps no modes (CIFS, some FUSE) still gets the bytes
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.emit.op("fsync", path)
        os.fsync(out)


def main() -> int:
    request = json.load(sys.stdin)
    emit = Emitter()
    Copier(request["source"], request["dest"], emit).run(request["jobs"], request.get("temps", []))
    emit(ev="end")
    emit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
