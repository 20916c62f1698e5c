"""Training runs on this host and their progress marks, from /proc only (never a file a run writes).

A run is the set of processes of one training job: the GPU compute processes, grouped under their
nearest launcher ancestor (torchrun, accelerate, deepspeed, mpirun, `python -m torch.distributed.run`),
with the launcher's other children (CPU gloo ranks) too; without a launcher, by Slurm job, pod or
container, else the process alone. Each rank's progress mark adds up what moves when a job makes
progress: bytes it sent to storage (/proc/PID/io write_bytes; rchar/wchar count sockets too, so a
collective's traffic would look like progress) and the write position of every file it has open for
writing (/proc/PID/fdinfo/N "pos:": no stat, so a hung mount cannot block the read). All of it bounded:
MAX_RANKS per run, MAX_FDS per rank, MAX_THREADS looked at per rank.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainguard.records import GpuSample, MountKind, RankSample, RunEnd, RunSample
from trainguard.sources.owner import read_environ, read_owner
from trainguard.sources.procs import is_blocked, read_cmdline

MAX_RANKS = 64
MAX_FDS = 256
MAX_THREADS = 128
MAX_DEPTH = 8  # ancestors looked at for a launcher
END_TAIL = 32768  # bytes of a gone run's stdout/stderr read for its error (4 ranks' tracebacks)
END_HOLD = 3600.0  # an ended run is reported this long
RANK_KEYS = ("RANK", "LOCAL_RANK")
ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # torchrun's rendezvous id: the same on every node of one job
_RAISED = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception): \S")  # "RuntimeError: loss is nan"
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)", re.DOTALL)
FAILURE_WORDS = ("ChildFailedError", "Killed", "Segmentation fault")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Launcher programs and modules, as they appear in a command line.
LAUNCHERS = {"torchrun": "torchrun", "torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
             "accelerate": "accelerate", "deepspeed": "deepspeed", "mpirun": "mpirun", "mpiexec": "mpirun",
             "horovodrun": "horovodrun"}


@dataclass(frozen=True, slots=True)
class Stat:
    ppid: int
    start: int  # clock ticks since boot: tells a process from a later one with its PID
    cpu_s: float
    state: str


def parse_stat(text: str) -> Stat | None:
    """The fields of /proc/PID/stat that matter here (comm may hold spaces and parentheses)."""
    tail = text[text.rfind(")") + 1:].split()
    if len(tail) < 20:
        return None
    try:
        return Stat(int(tail[1]), int(tail[19]), (int(tail[11]) + int(tail[12])) / _TICKS, tail[0])
    except ValueError:
        return None


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def launcher_kind(cmdline: Sequence[str]) -> str | None:
    """"torchrun" for `torchrun ...`, `python /venv/bin/torchrun ...` or `python -m torch.distributed.run
    ...`; None for anything else (a launcher's name later in the arguments is not the program)."""
    if not cmdline:
        return None
    program = os.path.basename(cmdline[0])
    if program in LAUNCHERS or not program.startswith("python"):
        return LAUNCHERS.get(program)
    rest = [a for a in cmdline[1:] if a == "-m" or not a.startswith("-")]  # interpreter flags (-u, -O)
    if rest[:1] == ["-m"]:
        return LAUNCHERS.get(rest[1]) if len(rest) > 1 else None
    return LAUNCHERS.get(os.path.basename(rest[0])) if rest else None


def parse_pos(fdinfo: str) -> int | None:
    for line in fdinfo.splitlines():
        key, _, value = line.partition(":")
        if key == "pos":
            return int(value.strip()) if value.strip().isdigit() else None
    return None


def parse_write_bytes(io_text: str) -> int:
    for line in io_text.splitlines():
        if line.startswith("write_bytes:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else 0
    return 0


class RunSampler:
    """Finds the runs each cycle; remembers the last cycle's to say which ended, and how."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        self._seen: dict[str, tuple[RunSample, float]] = {}
        self._ended: dict[str, RunEnd] = {}

    def sample(self, now: float, gpus: Sequence[GpuSample], heartbeats: Mapping[int, int] | None = None,
               local: Callable[[str], bool] = lambda _p: True) -> tuple[tuple[RunSample, ...], tuple[RunEnd, ...]]:
        """(the runs now, the runs that ended within END_HOLD). heartbeats: pid -> guard step;
        local(path): may the file be read (a gone run's output on a hung share is not)."""
        beats = dict(heartbeats or {})
        on_gpu: dict[int, list[int]] = {}
        for g in gpus:
            for p in g.processes:
                if p.pid is not None:
                    on_gpu.setdefault(p.pid, []).append(g.index)
        runs = self.discover(on_gpu, beats)
        for run in runs:
            self._seen[run.run_id] = (run, now)
            self._ended.pop(run.run_id, None)
        current = {r.run_id for r in runs}
        for run_id, (run, _ts) in list(self._seen.items()):
            if run_id not in current:
                del self._seen[run_id]
                self._ended[run_id] = RunEnd(run_id, run.name, now, self._error_of(run, local), run.owner)
        self._ended = {k: e for k, e in self._ended.items() if now - e.ts < END_HOLD}
        return runs, tuple(self._ended.values())

    def discover(self, on_gpu: Mapping[int, Sequence[int]], beats: Mapping[int, int]) -> tuple[RunSample, ...]:
        groups: dict[str, tuple[str, list[int], dict]] = {}
        stats: dict[int, Stat] = {}
        for pid in sorted(set(on_gpu) | set(beats)):
            stat = self._stat(pid, stats)
            if stat is None:
                continue
            launcher = self._launcher(pid, stats)
            owner = read_owner(self.proc_root, pid).to_dict()
            if launcher is not None:
                lpid, kind = launcher
                run_id, name = f"{lpid}@{stats[lpid].start}", f"{kind}-{lpid}"
            else:
                run_id, name = _owner_group(owner, pid, stat.start)
            entry = groups.setdefault(run_id, (name, [], owner))
            if launcher is not None and not entry[1]:
                entry[1].extend(self._children(launcher[0]))
            if pid not in entry[1]:
                entry[1].append(pid)
        runs = []
        for run_id, (name, pids, owner) in sorted(groups.items()):
            ranks = [r for pid in sorted(set(pids))[:MAX_RANKS]
                     if (r := self._rank(pid, on_gpu.get(pid, ()), beats.get(pid, 0), stats)) is not None]
            if ranks:
                runs.append(RunSample(run_id, name, tuple(ranks), owner, self._job(owner, ranks[0].pid, name)))
        return tuple(runs)

    def _job(self, owner: Mapping[str, object], pid: int, name: str) -> str:
        if owner.get("slurm_job"):
            return f"slurm-{owner['slurm_job']}"
        env, _complete = read_environ(self.proc_root, pid, (ELASTIC_RUN_ID,))
        return env.get(ELASTIC_RUN_ID) or name

    def _stat(self, pid: int, cache: dict[int, Stat]) -> Stat | None:
        if pid not in cache:
            text = _read(f"{self.proc_root}/{pid}/stat")
            stat = parse_stat(text) if text else None
            if stat is None:
                return None
            cache[pid] = stat
        return cache[pid]

    def _launcher(self, pid: int, stats: dict[int, Stat]) -> tuple[int, str] | None:
        """The nearest ancestor (or the process itself) that is a launcher."""
        current = pid
        for _ in range(MAX_DEPTH):
            stat = self._stat(current, stats)
            if stat is None or current <= 1:
                return None
            kind = launcher_kind(read_cmdline(self.proc_root, current))
            if kind is not None and current != pid:
                return current, kind
            current = stat.ppid
        return None

    def _children(self, pid: int) -> list[int]:
        text = _read(f"{self.proc_root}/{pid}/task/{pid}/children", 65536) or ""
        return [int(c) for c in text.split() if c.isdigit()][:MAX_RANKS]

    def _rank(self, pid: int, gpus: Sequence[int], step: int, stats: dict[int, Stat]) -> RankSample | None:
        stat = self._stat(pid, stats)
        if stat is None or stat.state == "Z":
            return None
        env, _complete = read_environ(self.proc_root, pid, RANK_KEYS)
        rank = next((int(env[k]) for k in RANK_KEYS if env.get(k, "").isdigit()), None)
        written, outputs = self._writes(pid)
        io = _read(f"{self.proc_root}/{pid}/io")
        mark = written + (parse_write_bytes(io) if io else 0) + step
        blocked, main = self._blocked(pid, stat.state)
        return RankSample(pid, rank, mark, stat.cpu_s, blocked, main, tuple(sorted(gpus)), outputs)

    def _writes(self, pid: int) -> tuple[int, tuple[str, ...]]:
        """(sum of the write positions of its files open for writing, its stdout/stderr files)."""
        base = f"{self.proc_root}/{pid}"
        try:
            names = sorted((n for n in os.listdir(f"{base}/fd") if n.isdigit()), key=int)[:MAX_FDS]
        except OSError:
            return 0, ()
        total, outputs = 0, []
        for name in names:
            try:
                target = os.readlink(f"{base}/fd/{name}")
            except OSError:
                continue
            if not target.startswith("/") or target.startswith("/dev/"):
                continue
            info = _read(f"{base}/fdinfo/{name}") or ""
            flags = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("flags:")), "")
            if not flags or int(flags, 8) & (os.O_WRONLY | os.O_RDWR) == 0:
                continue
            total += parse_pos(info) or 0
            if name in ("1", "2") and not target.endswith(" (deleted)"):
                outputs.append(target)
        return total, tuple(dict.fromkeys(outputs))

    def _blocked(self, pid: int, state: str) -> tuple[int, bool]:
        """(threads in D state or asleep in a filesystem wait (a hung FUSE read sleeps in S), whether the
        main thread is one of them)."""
        try:
            tids = sorted(int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task") if t.isdigit())[:MAX_THREADS]
        except OSError:
            return (1, True) if state == "D" else (0, False)
        blocked, main = 0, False
        for tid in tids:
            text = _read(f"{self.proc_root}/{pid}/task/{tid}/stat")
            stat = parse_stat(text) if text else None
            if stat is None or stat.state not in ("D", "S"):
                continue
            wchan = "" if stat.state == "D" else (_read(f"{self.proc_root}/{pid}/task/{tid}/wchan") or "").strip()
            if is_blocked(stat.state, wchan):
                blocked += 1
                main |= tid == pid
        return blocked, main

    def _error_of(self, run: RunSample, local: Callable[[str], bool]) -> str:
        for path in dict.fromkeys(p for r in run.ranks for p in r.outputs):
            if not local(path):
                continue
            if line := error_line(_tail(path)):
                return line
        return ""


def _owner_group(owner: Mapping[str, object], pid: int, start: int) -> tuple[str, str]:
    if job := owner.get("slurm_job"):
        return f"slurm:{job}", f"slurm-{job}"
    if pod := owner.get("pod"):
        return f"pod:{owner.get('namespace', '')}/{pod}", str(pod)
    if container := owner.get("container_id"):
        return f"container:{container}", f"container-{str(container)[:12]}"
    return f"{pid}@{start}", f"pid-{pid}"


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - END_TAIL))
            return fh.read(END_TAIL).decode("utf-8", "replace")
    except OSError:
        return ""


def error_line(text: str) -> str:
    """The line of a run's output tail that says why it failed: its last exception ("RuntimeError: loss
    is nan"), else the launcher's verdict (ChildFailedError) or a kill; "" when none says so."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in lines if _RAISED.search(ln) and "ChildFailedError" not in ln]
    if root := _ROOT_CAUSE.search(text):  # torchrun names the rank that failed first; the others followed it
        raised = [ln for ln in raised if ln.startswith(f"[rank{root.group(1)}]")] or raised
    if raised:
        return raised[-1][:300]
    return next((ln[:300] for ln in reversed(lines) if any(w in ln for w in FAILURE_WORDS)), "")


def local_paths(kinds: Iterable[tuple[str, MountKind]]) -> Callable[[str], bool]:
    """A predicate: the path is on a local mount (the longest mount point over it is local)."""
    table = sorted(kinds, key=lambda item: len(item[0]), reverse=True)

    def is_local(path: str) -> bool:
        for mp, kind in table:
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                return kind is MountKind.LOCAL
        return True
    return is_local
