"""Training runs on this host and their progress marks, from /proc only (never a file a run writes).

A run is the set of processes of one training job: the GPU compute processes, grouped under their
nearest launcher ancestor (torchrun, accelerate, deepspeed, mpirun, `python -m torch.distributed.run`),
with the launcher's other children (CPU gloo ranks) too; without a launcher, by Slurm job, pod or
container, else the process alone. Each rank's progress mark adds up what moves when a job makes
progress: bytes it sent to storage (/proc/PID/io write_bytes; rchar/wchar count sockets too, so a
collective's traffic would look like progress), the write position of every file it has open for
writing (/proc/PID/fdinfo/N "pos:": no stat, so a hung mount cannot block the read), and what the
reader of its stdout/stderr pipe writes (sources.pipes: `| tee train.log`). A watched log ([[logs]])
of the run, one under a rank's working directory or one the run was seen writing, counts too, by when
it last grew: a log opened, appended to and closed per line is never seen open. All of it bounded:
MAX_RANKS per run, sources.pipes.MAX_FDS per process, MAX_THREADS looked at per rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainguard.records import GpuSample, RankSample, RunEnd, RunSample
from trainguard.sources.owner import read_environ, read_owner
from trainguard.sources.pipes import PipeReaders, Writes, read_writes
from trainguard.sources.procs import is_blocked, read_cmdline, read_io, read_small
from trainguard.sources.run_end import END_HOLD, ending

MAX_RANKS = 64
MAX_THREADS = 128
MAX_DEPTH = 8  # ancestors looked at for a launcher
MAX_RECENT = 64  # files a run was seen writing, remembered per run
RECENT = 3600.0  # a file seen open for writing this recently is the run's (a log reopened per line)
RANK_KEYS = ("RANK", "LOCAL_RANK")
ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # torchrun's rendezvous id: the same on every node of one job
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



class RunSampler:
    """Finds the runs each cycle; remembers the last cycle's to say which ended, and how."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        self.pipes = PipeReaders(proc_root)
        self._seen: dict[str, tuple[RunSample, float]] = {}
        self._ended: dict[str, RunEnd] = {}
        self._recent: dict[str, dict[str, float]] = {}  # run id -> file it was seen writing -> when
        self._live_pipes: set[int] = set()  # the output pipes the runs of this cycle write to

    def sample(self, now: float, gpus: Sequence[GpuSample], heartbeats: Mapping[int, int] | None = None,
               local: Callable[[str], bool] = lambda _p: True, logs: Mapping[str, float] | None = None,
               ) -> tuple[tuple[RunSample, ...], tuple[RunEnd, ...]]:
        """(the runs now, the runs that ended within END_HOLD). heartbeats: pid -> guard step;
        local(path): may the file be read (a gone run's output on a hung share is not); logs: watched log
        -> when it last grew."""
        on_gpu: dict[int, list[int]] = {}
        for g in gpus:
            for p in g.processes:
                if p.pid is not None:
                    on_gpu.setdefault(p.pid, []).append(g.index)
        runs = self.discover(on_gpu, dict(heartbeats or {}), now, logs or {})
        for run in runs:
            self._seen[run.run_id] = (run, now)
            self._ended.pop(run.run_id, None)
        current = {r.run_id for r in runs}
        for run_id, (run, _ts) in list(self._seen.items()):
            if run_id not in current:
                del self._seen[run_id]
                self._recent.pop(run_id, None)
                how, line = ending((p for r in run.ranks for p in r.outputs), local)
                self._ended[run_id] = RunEnd(run_id, run.name, now, line, run.owner, how)
        self._ended = {k: e for k, e in self._ended.items() if now - e.ts < END_HOLD}
        return runs, tuple(self._ended.values())

    def discover(self, on_gpu: Mapping[int, Sequence[int]], beats: Mapping[int, int], now: float = 0.0,
                 logs: Mapping[str, float] | None = None) -> tuple[RunSample, ...]:
        groups: dict[str, tuple[str, list[int], dict, int | None]] = {}
        stats: dict[int, Stat] = {}
        self._live_pipes = set()
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
            entry = groups.setdefault(run_id, (name, [], owner, launcher[0] if launcher else None))
            if launcher is not None and not entry[1]:
                entry[1].extend(self._children(launcher[0]))
            if pid not in entry[1]:
                entry[1].append(pid)
        runs = []
        for run_id, (name, pids, owner, launcher) in sorted(groups.items()):
            ranks = self._ranks(run_id, pids, launcher, on_gpu, beats, stats, now, logs or {})
            if ranks:
                runs.append(RunSample(run_id, name, tuple(ranks), owner, self._job(owner, ranks[0].pid, name)))
        self.pipes.keep(self._live_pipes)
        return tuple(runs)

    def _ranks(self, run_id: str, pids: Sequence[int], launcher: int | None, on_gpu: Mapping[int, Sequence[int]],
               beats: Mapping[int, int], stats: dict[int, Stat], now: float,
               logs: Mapping[str, float]) -> list[RankSample]:
        """The run's ranks, lowest first. What the run writes that no one rank can be credited with (its
        launcher's output, a watched log of the run) is credited to the lowest rank."""
        found = []
        for pid in sorted(set(pids))[:MAX_RANKS]:
            stat = self._stat(pid, stats)
            if stat is not None and stat.state != "Z":
                env, _complete = read_environ(self.proc_root, pid, RANK_KEYS)
                rank = next((int(env[k]) for k in RANK_KEYS if env.get(k, "").isdigit()), None)
                found.append((rank, pid, stat, self._output(pid, now)))
        if not found:
            return []
        found.sort(key=lambda f: (f[0] is None, f[0] or 0, f[1]))
        shared = self._output(launcher, now) if launcher is not None else Writes()
        recent = self._remember(run_id, [w for *_, w in found] + [shared], now)
        self._live_pipes.update({i for *_, w in found for i in w.pipes} | set(shared.pipes))
        cwds = [d for _, pid, _, _ in found if (d := _cwd(self.proc_root, pid))]
        grew = [ts for path, ts in logs.items() if path in recent or any(_under(path, d) for d in cwds)]
        ranks = []
        for i, (rank, pid, stat, w) in enumerate(found):
            io = read_io(self.proc_root, pid)
            mark = w.total + (io.write_bytes if io else 0) + beats.get(pid, 0)
            if i == 0:
                mark += shared.total
            blocked, main = self._blocked(pid, stat.state)
            outputs = w.outputs + (shared.outputs if i == 0 else ())
            ranks.append(RankSample(pid, rank, mark, stat.cpu_s, blocked, main, tuple(sorted(on_gpu.get(pid, ()))),
                                    tuple(dict.fromkeys(outputs)), max(grew) if grew and i == 0 else None))
        return ranks

    def _output(self, pid: int, now: float) -> Writes:
        """What the process writes: its own files, and what the readers of its stdout/stderr pipes write."""
        w = read_writes(self.proc_root, pid)
        total, files, outputs = w.total, list(w.files), list(w.outputs)
        for inode in w.pipes:
            if (peer := self.pipes.writes(inode, pid, now)) is not None:
                total += peer.total
                files += peer.files
                outputs += peer.outputs
        return Writes(total, tuple(dict.fromkeys(files)), tuple(dict.fromkeys(outputs)), w.pipes)

    def _remember(self, run_id: str, writes: Sequence[Writes], now: float) -> dict[str, float]:
        """The files the run was seen writing within RECENT (MAX_RECENT of them, the latest)."""
        recent = self._recent.setdefault(run_id, {})
        recent.update((f, now) for w in writes for f in w.files)
        kept = sorted(((f, ts) for f, ts in recent.items() if now - ts < RECENT), key=lambda i: i[1])[-MAX_RECENT:]
        self._recent[run_id] = dict(kept)
        return self._recent[run_id]

    def _job(self, owner: Mapping[str, object], pid: int, name: str) -> str:
        if owner.get("slurm_job"):
            return f"slurm-{owner['slurm_job']}"
        env, _complete = read_environ(self.proc_root, pid, (ELASTIC_RUN_ID,))
        return env.get(ELASTIC_RUN_ID) or name

    def _stat(self, pid: int, cache: dict[int, Stat]) -> Stat | None:
        if pid not in cache:
            text = read_small(f"{self.proc_root}/{pid}/stat")
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
        text = read_small(f"{self.proc_root}/{pid}/task/{pid}/children", 65536) or ""
        return [int(c) for c in text.split() if c.isdigit()][:MAX_RANKS]

    def _blocked(self, pid: int, state: str) -> tuple[int, bool]:
        """(threads in D state or asleep in a filesystem wait (a hung FUSE read sleeps in S), whether the
        main thread is one of them)."""
        try:
            tids = sorted(int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task") if t.isdigit())[:MAX_THREADS]
        except OSError:
            return (1, True) if state == "D" else (0, False)
        blocked, main = 0, False
        for tid in tids:
            text = read_small(f"{self.proc_root}/{pid}/task/{tid}/stat")
            stat = parse_stat(text) if text else None
            if stat is None or stat.state not in ("D", "S"):
                continue
            wchan = "" if stat.state == "D" else (read_small(f"{self.proc_root}/{pid}/task/{tid}/wchan") or "").strip()
            if is_blocked(stat.state, wchan):
                blocked += 1
                main |= tid == pid
        return blocked, main


def _cwd(proc_root: str, pid: int) -> str:
    try:
        return os.readlink(f"{proc_root}/{pid}/cwd")
    except OSError:
        return ""


def _under(path: str, directory: str) -> bool:
    return directory not in ("", "/") and path.startswith(directory.rstrip("/") + "/")


def _owner_group(owner: Mapping[str, object], pid: int, start: int) -> tuple[str, str]:
    if job := owner.get("slurm_job"):
        return f"slurm:{job}", f"slurm-{job}"
    if pod := owner.get("pod"):
        return f"pod:{owner.get('namespace', '')}/{pod}", str(pod)
    if container := owner.get("container_id"):
        return f"container:{container}", f"container-{str(container)[:12]}"
    return f"{pid}@{start}", f"pid-{pid}"
