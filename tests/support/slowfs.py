"""A controllable FUSE filesystem for hung-I/O tests.

``SlowFs`` mounts a passthrough filesystem (every file really lives in a backing
directory) served by a *separate* Python process built on mfusepy.  The test
process never serves FUSE requests itself, so a blocked operation can only wedge
the callers that touch the mount, never pytest; and the server can be killed by
PID to simulate a crashed FUSE daemon ("Transport endpoint is not connected").

The server is steered over a UNIX socket that lives outside the mount, so
controlling it never touches the (possibly blocked) filesystem::

    with SlowFs(mountpoint, name="juicefs") as fs:      # fstype "fuse.juicefs"
        fs.block("statfs")
        worker = threading.Thread(target=os.statvfs, args=(mountpoint,))
        worker.start()
        fs.wait_blocked("statfs")                       # the caller now sits in the kernel
        ...
        fs.unblock("statfs")

Operations that can be blocked, delayed or made to fail are the names in
``OPS``; ``"all"`` stands for every one of them.  A blocked operation waits on a
condition variable in the server until it is unblocked, so the kernel-side
caller sits in ``request_wait_answer``.

This file doubles as the server's entry point: ``python slowfs.py --mountpoint
...`` (see ``_serve``).  The server half imports only the standard library and
mfusepy, so it runs without the test package on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

OPS = (
    "getattr", "readdir", "mkdir", "rmdir", "create", "open", "read", "write", "truncate",
    "unlink", "rename", "release", "flush", "fsync", "statfs", "utimens", "chmod",
)
ALL = "all"

_START_TIMEOUT_S = 15.0
_STEP_TIMEOUT_S = 5.0  # bound on each teardown step: unmount, terminate, kill
_CONTROL_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------- availability

_fuse_reason_cache: list[str | None] = []


def fuse_available() -> str | None:
    """Return why a FUSE filesystem cannot be mounted here, or None when it can.

    The reason names what is missing, for ``pytest.skip``.  The answer is cached.
    """
    if not _fuse_reason_cache:
        _fuse_reason_cache.append(_fuse_reason())
    return _fuse_reason_cache[0]


def _fuse_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"FUSE tests need Linux, this is {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (load the fuse module or pass --device /dev/fuse to the container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "not root and no fusermount3/fusermount to mount as a user"
    try:
        import mfusepy  # noqa: F401  (loads libfuse through ctypes)
    except ImportError:
        return "mfusepy is not installed (pip install mfusepy)"
    except OSError as exc:
        return f"libfuse cannot be loaded ({exc}); install libfuse2 or libfuse3"
    return None


# --------------------------------------------------------------------------- mount table

def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_entry(mountpoint: str | os.PathLike[str],
                mountinfo: str = "/proc/self/mountinfo") -> dict[str, str] | None:
    """Return the topmost mount at ``mountpoint`` from mountinfo, or None.

    Reads only the mount table, never the mount itself, so it is safe to call
    while the filesystem is blocked.  Keys: ``fstype``, ``source``, ``devno``.
    """
    target = os.path.realpath(mountpoint)
    found = None
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 2:
                continue
            if _unescape_mountinfo(fields[4]) == target:
                found = {"fstype": tail[0], "source": _unescape_mountinfo(tail[1]), "devno": fields[2]}
    return found


# --------------------------------------------------------------------------- test side

class SlowFsError(RuntimeError):
    """The slow filesystem could not be started or refused a control command."""


class SlowFs:
    """A blocking/delaying passthrough FUSE mount served by a child process.

    Args:
        mountpoint: an existing empty directory to mount on.
        backing_dir: where files really live; a temporary directory (removed on
            exit) when None.
        size: total bytes ``statvfs`` reports; used bytes are the real
            allocation of the backing directory.
        name: FUSE subtype, so the mount shows as ``fuse.<name>`` (e.g.
            ``"juicefs"`` to mimic ``fuse.juicefs``).
        source: the mount source (fsname) shown in the mount table; ``name``
            when None.
        direct_io: bypass the page cache so every read and write reaches the
            server (and therefore the gates).
        cache_s: how long the kernel may cache names and attributes, as a real
            FUSE filesystem does (libfuse's default is 1 s); 0, the default, sends
            every lookup and getattr to the server, so blocking them blocks callers.
    """

    def __init__(self, mountpoint: str | os.PathLike[str], backing_dir: str | os.PathLike[str] | None = None,
                 size: int = 100 * 2**20, *, name: str = "slowfs", source: str | None = None,
                 direct_io: bool = True, cache_s: float = 0.0) -> None:
        if size <= 0:
            raise ValueError(f"SlowFs size must be positive, got {size}")
        if not name or any(c in name for c in ", =/"):
            raise ValueError(f"SlowFs name must be a plain word (no ', =/'), got {name!r}")
        self.mountpoint = Path(mountpoint).resolve()
        self.name = name
        self.source = source or name
        self.size = size
        self.direct_io = direct_io
        self.cache_s = float(cache_s)
        self._given_backing = backing_dir is not None
        self.backing_dir = Path(backing_dir).resolve() if backing_dir is not None else None
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    # -- lifecycle

    @property
    def fstype(self) -> str:
        """The filesystem type the mount table shows, ``fuse.<name>``."""
        return f"fuse.{self.name}"

    @property
    def pid(self) -> int:
        """PID of the FUSE server process."""
        if self._proc is None:
            raise SlowFsError("SlowFs is not started")
        return self._proc.pid

    @property
    def control_path(self) -> Path:
        assert self._workdir is not None, "SlowFs is not started"
        return self._workdir / "control.sock"

    def start(self) -> SlowFs:
        """Start the server and wait until the mount is in /proc/self/mountinfo."""
        if self._proc is not None:
            raise SlowFsError("SlowFs is already started")
        reason = fuse_available()
        if reason:
            raise SlowFsError(f"FUSE is not usable: {reason}")
        if not self.mountpoint.is_dir():
            raise SlowFsError(f"mountpoint {self.mountpoint} is not a directory")
        self._workdir = Path(tempfile.mkdtemp(prefix="slowfs-"))
        if self.backing_dir is None:
            self.backing_dir = self._workdir / "backing"
            self.backing_dir.mkdir()
        self._log = open(self._workdir / "server.log", "wb")  # noqa: SIM115 - closed in close()
        argv = [sys.executable, os.path.abspath(__file__), "--mountpoint", str(self.mountpoint),
                "--backing", str(self.backing_dir), "--control", str(self.control_path),
                "--size", str(self.size), "--name", self.name, "--source", self.source, "--cache-s", str(self.cache_s)]
        if self.direct_io:
            argv.append("--direct-io")
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                      start_new_session=True)  # a ^C in the terminal must not kill it mid-test
        try:
            self._wait_mounted()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_mounted(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            entry = mount_entry(self.mountpoint)
            if entry and entry["fstype"] == self.fstype and self.control_path.exists():
                return
            if self._proc is not None and self._proc.poll() is not None:
                raise SlowFsError(f"slowfs server exited with {self._proc.returncode} before mounting: "
                                  f"{self.server_log()[-2000:]}")
            if time.monotonic() > deadline:
                raise SlowFsError(f"{self.mountpoint} not mounted as {self.fstype} within {_START_TIMEOUT_S}s: "
                                  f"{self.server_log()[-2000:]}")
            time.sleep(0.02)

    def server_log(self) -> str:
        """What the server wrote to stdout/stderr so far (for failure messages)."""
        if self._workdir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self._workdir / "server.log").read_text(errors="replace")
        return ""

    def is_mounted(self) -> bool:
        """Whether the mount table still shows this filesystem (does not touch the mount)."""
        entry = mount_entry(self.mountpoint)
        return bool(entry and entry["fstype"] == self.fstype)

    def kill(self) -> None:
        """SIGKILL the server, leaving a dead mount whose callers get ENOTCONN."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(_STEP_TIMEOUT_S)

    def close(self) -> None:
        """Unblock everything, unmount, stop the server; every wait is bounded."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, SlowFsError, ValueError):
                self._command({"cmd": "reset"}, timeout=2.0)
        self._unmount()
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(_STEP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(_STEP_TIMEOUT_S)
            self._unmount()  # a killed server leaves a dead mount behind
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)  # includes a backing dir we created
            self._workdir = None
        if not self._given_backing:
            self.backing_dir = None
        self._proc = None

    def _unmount(self) -> None:
        for argv in (["fusermount3", "-u", "-q"], ["fusermount", "-u", "-q"], ["umount", "-l"]):
            if not self.is_mounted():
                return
            if shutil.which(argv[0]) is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run([*argv, str(self.mountpoint)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=_STEP_TIMEOUT_S)

    def __enter__(self) -> SlowFs:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- control

    def block(self, op: str) -> None:
        """Make ``op`` (or ``"all"``) wait in the server until ``unblock``."""
        self._command({"cmd": "block", "op": op})

    def unblock(self, op: str) -> None:
        """Release ``op``; ``unblock("all")`` releases every blocked operation."""
        self._command({"cmd": "unblock", "op": op})

    def delay(self, op: str, seconds: float) -> None:
        """Make each ``op`` take ``seconds`` longer; 0 removes the delay, also for waiting callers."""
        self._command({"cmd": "delay", "op": op, "seconds": float(seconds)})

    def fail(self, op: str, error: int | None) -> None:
        """Make ``op`` fail with errno ``error`` (e.g. ``errno.EIO``); None stops failing."""
        self._command({"cmd": "fail", "op": op, "errno": error})

    def reset(self) -> None:
        """Unblock everything and clear all delays and failures."""
        self._command({"cmd": "reset"})

    def stats(self) -> dict[str, dict[str, int]]:
        """``{"calls": {op: n}, "waiting": {op: n}}``: requests seen, callers blocked now."""
        return self._command({"cmd": "stats"})

    def wait_blocked(self, op: str, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``count`` callers of ``op`` are held by a block; raise TimeoutError otherwise."""
        reply = self._command({"cmd": "wait_blocked", "op": op, "count": count, "timeout": timeout},
                              timeout=timeout + _CONTROL_TIMEOUT_S)
        if not reply["reached"]:
            raise TimeoutError(f"{reply['waiting']} of {count} {op} callers blocked after {timeout}s")

    def _command(self, message: dict, timeout: float = _CONTROL_TIMEOUT_S) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            raise SlowFsError("slowfs server is not running")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.control_path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(sock.makefile("rb").readline() or b'{"error": "no reply"}')
        if "error" in reply:
            raise ValueError(f"slowfs {message['cmd']}: {reply['error']}")
        return reply


# --------------------------------------------------------------------------- server side

class _Gates:
    """Per-operation block / delay / failure switches shared by FUSE and control threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._blocked: set[str] = set()
        self._delays: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self.calls: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()

    @staticmethod
    def check_op(op: object) -> str:
        if op != ALL and op not in OPS:
            raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}, {ALL}")
        return str(op)

    def _is_blocked(self, op: str) -> bool:
        return op in self._blocked or ALL in self._blocked

    def _delay_of(self, op: str) -> float:
        return self._delays.get(op, self._delays.get(ALL, 0.0))

    def enter(self, op: str) -> None:
        """Called at the top of every FUSE operation: wait, delay or fail as configured."""
        started = time.monotonic()
        with self._cond:
            self.calls[op] += 1
            if self._is_blocked(op):
                self.waiting[op] += 1
                self._cond.notify_all()
                try:
                    while self._is_blocked(op):
                        self._cond.wait()
                finally:
                    self.waiting[op] -= 1
            # Re-read the delay on every wake-up so changing it applies to callers already waiting.
            while (remaining := started + self._delay_of(op) - time.monotonic()) > 0:
                self._cond.wait(remaining)
            error = self._failures.get(op, self._failures.get(ALL))
        if error:
            raise OSError(error, os.strerror(error))

    def control(self, message: dict) -> dict:
        cmd = message.get("cmd")
        with self._cond:
            if cmd == "block":
                self._blocked.add(self.check_op(message.get("op")))
            elif cmd == "unblock":
                op = self.check_op(message.get("op"))
                if op == ALL:
                    self._blocked.clear()
                else:
                    self._blocked.discard(op)
            elif cmd == "delay":
                seconds = float(message.get("seconds", 0))
                if seconds < 0:
                    raise ValueError(f"delay must be >= 0 seconds, got {seconds}")
                self._delays[self.check_op(message.get("op"))] = seconds
            elif cmd == "fail":
                op, error = self.check_op(message.get("op")), message.get("errno")
                if error is None:
                    self._failures.pop(op, None)
                else:
                    self._failures[op] = int(error)
            elif cmd == "reset":
                self._blocked.clear()
                self._delays.clear()
                self._failures.clear()
            elif cmd == "stats":
                return {"calls": dict(self.calls), "waiting": {k: v for k, v in self.waiting.items() if v}}
            elif cmd == "wait_blocked":
                op, count = self.check_op(message.get("op")), int(message.get("count", 1))
                self._cond.wait_for(lambda: self._waiting_for(op) >= count, float(message.get("timeout", 5)))
                return {"reached": self._waiting_for(op) >= count, "waiting": self._waiting_for(op)}
            else:
                raise ValueError(f"unknown command {cmd!r}")
            self._cond.notify_all()
        return {"ok": True}

    def _waiting_for(self, op: str) -> int:
        return sum(self.waiting.values()) if op == ALL else self.waiting[op]


def _make_operations(backing: str, size: int, gates: _Gates):
    import mfusepy

    class Passthrough(mfusepy.Operations):
        """Mirror ``backing``; every operation first passes its gate."""

        use_ns = True

        def _full(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def getattr(self, path, fh=None):
            gates.enter("getattr")
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            attrs = {key: getattr(st, key) for key in (
                "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_ino")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path, fh):
            gates.enter("readdir")
            return [".", "..", *os.listdir(self._full(path))]

        def mkdir(self, path, mode):
            gates.enter("mkdir")
            os.mkdir(self._full(path), mode)
            return 0

        def rmdir(self, path):
            gates.enter("rmdir")
            os.rmdir(self._full(path))
            return 0

        def create(self, path, mode, flags):
            gates.enter("create")
            return os.open(self._full(path), flags | os.O_CREAT, mode)

        def open(self, path, flags):
            gates.enter("open")
            return os.open(self._full(path), flags)

        def read(self, path, size, offset, fh):
            gates.enter("read")
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            gates.enter("write")
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            gates.enter("truncate")
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._full(path), length)
            return 0

        def unlink(self, path):
            gates.enter("unlink")
            os.unlink(self._full(path))
            return 0

        def rename(self, old, new):
            gates.enter("rename")
            os.rename(self._full(old), self._full(new))
            return 0

        def chmod(self, path, mode):
            gates.enter("chmod")
            os.chmod(self._full(path), mode)
            return 0

        def release(self, path, fh):
            gates.enter("release")
            os.close(fh)
            return 0

        def flush(self, path, fh):
            gates.enter("flush")
            return 0

        def fsync(self, path, datasync, fh):
            gates.enter("fsync")
            (os.fdatasync if datasync else os.fsync)(fh)
            return 0

        def utimens(self, path, times=None):
            gates.enter("utimens")
            if times is None:
                os.utime(self._full(path))
            else:
                os.utime(self._full(path), ns=(int(times[0]), int(times[1])))
            return 0

        def statfs(self, path):
            gates.enter("statfs")
            block = 4096
            used = 0
            for root, dirs, files in os.walk(backing):
                for name in dirs + files:
                    with contextlib.suppress(OSError):
                        used += os.lstat(os.path.join(root, name)).st_blocks * 512
            total = size // block
            free = max(total - -(-used // block), 0)
            return {"f_bsize": block, "f_frsize": block, "f_blocks": total, "f_bfree": free,
                    "f_bavail": free, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_favail": 1 << 20,
                    "f_namemax": 255}

    return Passthrough()


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="slow passthrough FUSE server for tests")
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--backing", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--name", default="slowfs")
    parser.add_argument("--source", default="slowfs")
    parser.add_argument("--direct-io", action="store_true")
    parser.add_argument("--cache-s", type=float, default=0.0)
    args = parser.parse_args(argv)

    import mfusepy

    gates = _Gates()

    class ControlHandler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            try:
                reply = gates.control(json.loads(self.rfile.readline()))
            except (ValueError, TypeError, KeyError) as exc:
                reply = {"error": str(exc)}
            self.wfile.write(json.dumps(reply).encode() + b"\n")

    class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    control = ControlServer(args.control, ControlHandler)
    threading.Thread(target=control.serve_forever, name="slowfs-control", daemon=True).start()

    # Kernel-side caching would answer getattr/lookup without asking us, so a blocked getattr
    # would not block; zero timeouts (the default) send every request to the gates.
    options = {"fsname": args.source, "subtype": args.name, "attr_timeout": args.cache_s,
               "entry_timeout": args.cache_s, "negative_timeout": 0, "direct_io": args.direct_io}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # libfuse installs its own clean-exit handler over SIG_DFL
    try:
        mfusepy.FUSE(_make_operations(args.backing, args.size, gates), args.mountpoint,
                     foreground=True, nothreads=False, **options)
    finally:
        control.server_close()
        with contextlib.suppress(OSError):
            os.unlink(args.control)
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1:]))
