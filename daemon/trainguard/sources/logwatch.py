"""Watching training logs for the lines that explain a dead or stalled run.

FileTail follows one path like `tail -F`: it starts at the end, survives rotation
by rename (drains the old file, then reads the new one from its start) and
copytruncate (the file shrinks: start over), and keeps a partial last line until
its newline arrives. LogWatcher expands the [[logs]] globs (new matching files are
read from their start), matches the configured patterns over whole chunks at once
(a fast-growing 100 MB log costs one regex scan, not a Python loop per line) and
keeps recent matches for the detectors.

watchdog wakes the reader promptly: inotify on local filesystems; its polling
observer on network/FUSE mounts, where inotify never sees writes made on other
hosts. When inotify runs out of watches, the directory falls back to polling with
a warning. A periodic poll runs regardless, so a missed event only delays a line.
"""

from __future__ import annotations

import collections
import errno
import glob
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from trainguard.config import LogWatch
from trainguard.records import LogMatch, Mount
from trainguard.sources.mounts import containing_mount, read_mounts

log = logging.getLogger("trainguard.logs")

CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" longer than this is cut, so a binary file cannot eat memory
MAX_KEPT = 200  # matches kept per (file, pattern): a flood of one pattern cannot push out another


class FileTail:
    """Complete new lines of one path, as bytes blocks that each end with a newline."""

    def __init__(self, path: str, from_start: bool = False):
        self.path = path
        self._fh = None
        self._id: tuple[int, int] | None = None
        self.offset = 0
        self._partial = b""
        self._open(at_end=not from_start)

    def _open(self, at_end: bool) -> bool:
        try:
            fh = open(self.path, "rb")
        except OSError:
            return False
        st = os.fstat(fh.fileno())
        if self._fh is not None:
            self._fh.close()
        self._fh, self._id = fh, (st.st_dev, st.st_ino)
        self.offset = st.st_size if at_end else 0
        fh.seek(self.offset)
        self._partial = b""
        return True

    def poll(self) -> list[bytes]:
        blocks: list[bytes] = []
        if self._fh is None:
            if not self._open(at_end=False):  # appeared after we started: read it all
                return blocks
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) != self._id:
            # Rotated by rename: finish the old file, then follow the new one from its start.
            # (While the path is missing, the writer may still append to the old file: keep reading it.)
            blocks += self._drain()
            if self._partial:
                blocks.append(self._partial + b"\n")
            self._open(at_end=False)
        elif st is not None and st.st_size < self.offset:
            # copytruncate: the same file was emptied; its new content starts at 0.
            self.offset = 0
            self._partial = b""
            self._fh.seek(0)
        blocks += self._drain()
        return blocks

    def _drain(self) -> list[bytes]:
        out = []
        while True:
            data = self._fh.read(CHUNK)
            if not data:
                return out
            self.offset += len(data)
            buf = self._partial + data
            cut = buf.rfind(b"\n")
            if cut < 0:
                self._partial = buf
                if len(buf) > MAX_LINE:
                    out.append(buf + b"\n")
                    self._partial = b""
            else:
                out.append(buf[:cut + 1])
                self._partial = buf[cut + 1:]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


_META = set(".^$*+?{}[]\\|()")


def literal_prefix(pattern: str) -> str:
    """The plain text every match of the pattern starts with ("" when there is none to rely on)."""
    out = []
    for i, c in enumerate(pattern):
        if c in _META:
            if c in "*?{" and out:
                out.pop()  # the character before a quantifier is optional
            break
        out.append(c)
    return "".join(out)


class Matcher:
    """The patterns of one [[logs]] entry, matched over whole blocks of lines.

    A pattern that starts with plain text is found with bytes.find (memchr speed) and only
    the lines that contain that text go through the regex; the others scan the block.
    """

    def __init__(self, patterns: Sequence[str]):
        self.patterns = list(patterns)
        self._compiled = []
        for p in self.patterns:
            lit = literal_prefix(p)
            self._compiled.append((p, lit.encode("utf-8") if len(lit) >= 3 else b"", re.compile(p.encode("utf-8"))))

    def lines(self, block: bytes) -> list[tuple[str, str]]:
        """(line, pattern) for each line in the block with a match, in file order; one per line."""
        hits: dict[int, tuple[int, str, int]] = {}  # line start -> (pattern order, pattern, line end)
        for order, (pattern, literal, regex) in enumerate(self._compiled):
            if literal:
                pos = block.find(literal)
                while pos >= 0:
                    start = block.rfind(b"\n", 0, pos) + 1
                    end = block.find(b"\n", pos)
                    end = len(block) if end < 0 else end
                    if start not in hits and regex.search(block, start, end):
                        hits[start] = (order, pattern, end)
                    pos = block.find(literal, end)
            else:
                for m in regex.finditer(block):
                    start = block.rfind(b"\n", 0, m.start()) + 1
                    end = block.find(b"\n", m.end())
                    end = len(block) if end < 0 else end
                    if start not in hits or hits[start][0] > order:
                        hits[start] = (order, pattern, end)
        return [(block[start:end].decode("utf-8", "replace").rstrip("\r"), pattern)
                for start, (_order, pattern, end) in sorted(hits.items())]


@dataclass
class _Watch:
    spec: LogWatch
    matcher: Matcher
    tails: dict[str, FileTail]


def _mount_kind(path: str, mounts: Sequence[Mount]) -> str:
    mount = containing_mount(path, mounts)
    return mount.kind.value if mount else "local"


class LogWatcher:
    """Follows the [[logs]] files; recent(now) gives the matches still within their hold time."""

    def __init__(self, specs: Sequence[LogWatch], *, clock: Callable[[], float] = time.time,
                 poll_interval: float = 2.0, proc_root: str = "/proc", use_watchdog: bool = True):
        self.clock = clock
        self.poll_interval = poll_interval
        self.proc_root = proc_root
        self.use_watchdog = use_watchdog
        self._watches = [_Watch(s, Matcher(s.patterns), {}) for s in specs]
        self._matches: dict[tuple[str, str], collections.deque[LogMatch]] = {}  # (path, pattern) -> matches
        self._hold: dict[tuple[str, str], float] = {}
        self._grew: dict[str, float] = {}  # path -> when it last grew (a training run's progress)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observers: list = []
        self.observed: dict[str, str] = {}  # directory -> "inotify" / "polling"
        self.warnings: list[str] = []
        for w in self._watches:
            for path in self._expand(w.spec):
                w.tails[path] = FileTail(path, from_start=False)

    @staticmethod
    def _expand(spec: LogWatch) -> list[str]:
        found: list[str] = []
        for pattern in spec.paths:
            for path in sorted(glob.glob(os.path.expanduser(pattern), recursive=True)):
                if os.path.isfile(path) and path not in found:
                    found.append(path)
        return found

    # --- reading -----------------------------------------------------------------

    def poll(self) -> int:
        """Read what is new everywhere; returns the number of new matches."""
        now = self.clock()
        new = 0
        for w in self._watches:
            for path in self._expand(w.spec):
                if path not in w.tails:
                    w.tails[path] = FileTail(path, from_start=True)
            for path, tail in list(w.tails.items()):
                before = tail.offset
                try:
                    blocks = tail.poll()
                except OSError as exc:
                    log.warning("reading %s failed: %s", path, exc)
                    continue
                if tail.offset != before:
                    with self._lock:
                        self._grew[path] = now
                found = [LogMatch(path, line, pattern, now)
                         for block in blocks for line, pattern in w.matcher.lines(block)]
                if found:
                    new += len(found)
                    with self._lock:
                        for match in found:
                            key = (path, match.pattern)
                            self._matches.setdefault(key, collections.deque(maxlen=MAX_KEPT)).append(match)
                            self._hold[key] = w.spec.hold
        return new

    def grown(self) -> dict[str, float]:
        """Each followed file that grew since it was first followed -> when it last did."""
        with self._lock:
            return dict(self._grew)

    def recent(self, now: float | None = None) -> tuple[LogMatch, ...]:
        now = self.clock() if now is None else now
        with self._lock:
            out = []
            for key, kept in self._matches.items():
                hold = self._hold.get(key, 1800.0)
                while kept and kept[0].ts < now - hold:
                    kept.popleft()
                out.extend(kept)
        return tuple(sorted(out, key=lambda m: m.ts))

    # --- background following ----------------------------------------------------

    def start(self) -> "LogWatcher":
        if self.use_watchdog:
            self._start_observers()
        self._thread = threading.Thread(target=self._run, name="trainguard-logs", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # keep following the other files
                log.exception("log watcher poll failed")
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def _directories(self) -> dict[str, str]:
        """Directory -> the observer mode it needs."""
        try:
            mounts = read_mounts(self.proc_root, own=True)
        except OSError:
            mounts = []
        dirs: dict[str, str] = {}
        for w in self._watches:
            for pattern in w.spec.paths:
                directory = _static_prefix(os.path.expanduser(pattern))
                if not os.path.isdir(directory):
                    continue
                mode = w.spec.observer
                if mode == "auto":
                    mode = "polling" if _mount_kind(directory, mounts) != "local" else "inotify"
                dirs[directory] = "polling" if "polling" in (mode, dirs.get(directory)) else mode
        return dirs

    def _start_observers(self) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
            from watchdog.observers.polling import PollingObserver
        except ImportError:
            self.warnings.append("watchdog is not installed: log files are polled every "
                                 f"{self.poll_interval:g}s")
            log.warning(self.warnings[-1])
            return
        wake = self._wake

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event):  # noqa: ANN001 - watchdog's signature
                wake.set()

        handler = Wake()
        dirs = self._directories()
        inotify_dirs = [d for d, mode in dirs.items() if mode == "inotify"]
        polling_dirs = [d for d, mode in dirs.items() if mode == "polling"]
        if inotify_dirs:
            inotify = Observer()
            try:
                # inotify_init/add_watch happen here: the watch and instance limits hit now.
                for directory in inotify_dirs:
                    inotify.schedule(handler, directory, recursive=True)
                inotify.daemon = True
                inotify.start()
                self._observers.append(inotify)
                self.observed.update({d: "inotify" for d in inotify_dirs})
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EMFILE):
                    why = "raise fs.inotify.max_user_watches / max_user_instances"
                else:
                    why = "inotify unavailable"
                self.warnings.append(f"inotify limit reached ({exc.strerror or exc}; {why}): "
                                     f"polling {', '.join(inotify_dirs)} instead")
                log.warning(self.warnings[-1])
                try:
                    inotify.stop()
                except Exception:  # noqa: BLE001 - it never started
                    pass
                polling_dirs += inotify_dirs
        if polling_dirs:
            polling = PollingObserver(timeout=self.poll_interval)
            for directory in polling_dirs:
                polling.schedule(handler, directory, recursive=True)
                self.observed[directory] = "polling"
            polling.daemon = True
            polling.start()
            self._observers.append(polling)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for observer in self._observers:
            observer.stop()
        for observer in self._observers:
            observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for w in self._watches:
            for tail in w.tails.values():
                tail.close()


def _static_prefix(pattern: str) -> str:
    """The directory part of a glob before its first wildcard."""
    parts = []
    for part in pattern.split(os.sep):
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    path = os.sep.join(parts) or os.sep
    return path if os.path.isdir(path) else os.path.dirname(path) or os.sep
