"""Which rank holds the others: a hang across the ranks of one run, from their stacks and /proc.

When one rank of a job stops (a read from a hung share, a stuck data loader, a dead process), the
others wait for it inside a collective (all_reduce, barrier, ...), so every rank looks hung. Two
py-spy dumps some seconds apart show each rank's main-thread stack and whether it moved; /proc shows
its blocked threads and the file and mount they wait on (diagnosis.threads, as for a GPU stall).
When all ranks but one sit in a collective, the odd one out is the holder. The gathering runs in the
stall diagnoser's worker (diagnosis.stall); the rest is pure.
"""

from __future__ import annotations

import collections
import dataclasses
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from trainguard.diagnosis.model import ProcessView
from trainguard.diagnosis.threads import (
    py_spy_dump,
    py_spy_threads,
    remote_fd_flags,
    view_process,
)
from trainguard.diagnosis.words import run_remedy_text, run_verdict_text
from trainguard.diagnosis.worker import Children
from trainguard.i18n import tr
from trainguard.records import Finding, FsSample
from trainguard.sources import procs
from trainguard.sources.procs import ThreadInfo

MAX_RANKS = 16  # ranks inspected per run (py-spy costs ~0.2 s each, twice): blocked ones first, then spread
DUMP_INTERVAL_S = 2.0  # between the two dumps: a stack that did not move in this time is stuck
DUMP_TIMEOUT_S = 3.0
STACK_FRAMES = 8  # of the main thread's stack, innermost first, kept per rank

# Frames of a collective: these names anywhere (outside threading.py, whose Barrier is not one) ...
COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
                    "monitored_barrier", "wait_for_everyone")
# ... and these only in the files of a communication library.
COMM_NAMES = ("wait", "_wait", "synchronize", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv")
COMM_FILES = ("torch/distributed/", "c10d", "gloo", "nccl", "deepspeed/comm/", "horovod/")
DATALOADER_FILES = ("torch/utils/data/",)
# DDP and FSDP reduce gradients from hooks the autograd engine runs in C++: a rank waiting in that
# reduction shows, to py-spy without --native, only as backward's own frame, still across both dumps.
BACKWARD_NAMES = ("_engine_run_backward", "run_backward")
BACKWARD_FILES = ("torch/autograd/",)
BACKWARD_COLLECTIVE = "all_reduce (gradients, in backward)"


class Frame(NamedTuple):
    name: str  # qualified where py-spy knows it: "_BaseDataLoaderIter.__next__"
    file: str
    line: int

    @property
    def base(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def at(self) -> str:
        """"Shard.__getitem__ (ranks.py:10)"."""
        return f"{self.name} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


Stack = tuple[Frame, ...]  # innermost first


@dataclass(frozen=True, slots=True)
class RankSample:
    """What was read of one rank: /proc (None: gone or unreadable) and two dumps (None: no stacks)."""

    rank: int
    pid: int
    view: ProcessView | None
    main: ThreadInfo | None  # its main thread, from /proc
    first: Mapping[int, Stack] | None
    second: Mapping[int, Stack] | None


def parse_stacks(text: str) -> dict[int, Stack]:
    """`py-spy dump --json` -> {os thread id: its frames, innermost first}."""
    out = {}
    for t in py_spy_threads(text):
        frames = tuple(Frame(str(f.get("name", "")), str(f.get("short_filename") or f.get("filename", "")),
                             int(f.get("line") or 0)) for f in t.get("frames") or () if isinstance(f, dict))
        out[int(t.get("os_thread_id") or t.get("native_thread_id"))] = frames
    return out


def _in(frame: Frame, files: Sequence[str]) -> bool:
    return any(part in frame.file for part in files)


def collective_of(stack: Stack) -> str:
    """The collective a stack waits in ("all_reduce"), "" when none: a named collective wins over a wait."""
    named = [f.base for f in stack if f.base.startswith(COLLECTIVE_NAMES) and not f.file.endswith("threading.py")]
    if named:
        return named[0]
    comm = [f.base for f in stack if _in(f, COMM_FILES) and (f.base in COMM_NAMES or "ProcessGroup" in f.name)]
    if comm:
        return comm[0]
    return BACKWARD_COLLECTIVE if any(f.base in BACKWARD_NAMES and _in(f, BACKWARD_FILES) for f in stack) else ""


def dataloader_frame(stack: Stack) -> str:
    """"DataLoader.__next__": the outermost data-loader frame, the one the training loop called."""
    inside = [f for f in stack if _in(f, DATALOADER_FILES)]
    return f"DataLoader.{inside[-1].base}" if inside else ""


def main_stack(pid: int, stacks: Mapping[int, Stack] | None) -> Stack | None:
    if not stacks:
        return None
    return stacks.get(pid, next(iter(stacks.values())))


def still_threads(pid: int, first: Mapping[int, Stack] | None, second: Mapping[int, Stack] | None,
                  limit: int = 8) -> list[dict[str, Any]]:
    """The other threads whose stacks did not move between the dumps, each with the top of its stack."""
    if not first or not second:
        return []
    same = [tid for tid, stack in second.items() if tid != pid and stack and first.get(tid) == stack]
    return [{"tid": tid, "stack": [f.at() for f in second[tid][:4]]} for tid in sorted(same)[:limit]]


def _blocked_file(s: RankSample) -> tuple[str | None, str | None, str]:
    """(file, mount, syscall) a blocked thread waits on: the main thread's first, else any thread's."""
    if s.view is None:
        return None, None, ""
    threads = sorted(s.view.blocked_threads, key=lambda t: (t.tid != s.pid, t.file is None))
    for t in threads:
        if t.file:
            return t.file, t.mount_point, t.syscall
    if threads and s.view.remote_files:
        f = s.view.remote_files[0]
        return f.path, f.mount_point, ""
    return None, None, ""


def rank_row(s: RankSample) -> dict[str, Any]:
    """One rank's facts: state, frame, file, mount, whether its stack moved, and its kind:
    collective / io / other / unknown (no stacks and nothing blocked) / gone."""
    row: dict[str, Any] = {"rank": s.rank, "pid": s.pid}
    if s.view is None or not s.view.resolved or (s.main is not None and s.main.state in ("Z", "X")):
        return {**row, "kind": "gone", "state": s.main.state if s.main else "", "frame": "", "moved": None}
    first, second = main_stack(s.pid, s.first), main_stack(s.pid, s.second)
    stack = second if second is not None else first
    file, mount, syscall = _blocked_file(s)
    main = s.main
    row.update(state=main.state if main else s.view.state, wchan=main.wchan if main else "",
               syscall=syscall or (main.syscall if main else ""), file=file, mount=mount,
               moved=None if first is None or second is None else first != second)
    loader = dataloader_frame(stack or ())
    row.update(frame=loader or (stack[0].name if stack else ""), at=stack[0].at() if stack else "",
               dataloader=bool(loader), stack=[f.at() for f in (stack or ())[:STACK_FRAMES]],
               still=still_threads(s.pid, s.first, s.second))
    collective = collective_of(stack or ()) if not row["moved"] else ""
    if collective:
        return {**row, "kind": "collective", "collective": collective}
    if file or loader or (main is not None and main.state == "D"):
        return {**row, "kind": "io"}
    return {**row, "kind": "other" if stack else "unknown"}


def verdict_of(rows: Sequence[Mapping[str, Any]]) -> tuple[str, Mapping[str, Any] | None]:
    """(verdict code, the rank it names). The odd-one-out rule: all ranks but one wait in a collective,
    and that one is known (a rank without stacks and nothing blocked may be waiting too)."""
    odd = [r for r in rows if r["kind"] != "collective"]
    if len(rows) >= 2 and len(odd) == 1 and odd[0]["kind"] != "unknown":
        return "rank_holds_collective", odd[0]
    if rows and not odd:
        return "all_in_collective", None
    blocked = [r for r in odd if r["kind"] == "io" and r.get("file")] or [
        r for r in odd if r["kind"] == "io" and r.get("state") == "D"]
    if blocked:
        return "blocked_io", blocked[0]
    loaders = [r for r in odd if r.get("dataloader")]
    if loaders:
        return "dataloader_deadlock", loaders[0]
    return "unknown", None


def run_diagnosis(samples: Sequence[RankSample], stacks: str, total: int | None = None) -> dict[str, Any]:
    """The details a train.hang finding carries: verdict, holder, collective, waiting ranks, per-rank rows.

    `stacks`: "py-spy" (dumps read), "missing" (no py-spy), "failed" (py-spy could not read the ranks),
    "off" (turned off)."""
    rows = sorted((rank_row(s) for s in samples), key=lambda r: r["rank"])
    verdict, named = verdict_of(rows)
    waiting = [r for r in rows if r["kind"] == "collective"]
    collectives = [r["collective"] for r in waiting]
    out: dict[str, Any] = {
        "verdict": verdict, "diagnosis": rows, "stacks": stacks,
        "holder": _holder(named) if verdict == "rank_holds_collective" else None,
        "blocked_rank": _holder(named) if named is not None and verdict != "rank_holds_collective" else None,
        "collective": collections.Counter(collectives).most_common(1)[0][0] if collectives else "",
        "waiting_ranks": [r["rank"] for r in waiting],
        "ranks_total": max(total or 0, len(rows))}
    if stacks != "py-spy":
        out["stacks_note"] = STACKS_NOTES[stacks]
    return out


STACKS_NOTES = {
    "off": "py-spy is turned off ([gpu] py_spy = false): no stacks, what /proc shows",
    "missing": "py-spy is not installed: no stacks, what /proc shows",
    "failed": "py-spy could not read the ranks (no ptrace rights: run as root or with CAP_SYS_PTRACE): "
              "no stacks, what /proc shows",
}


def _holder(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("rank", "pid", "kind", "frame", "at", "file", "mount", "syscall", "state", "dataloader")
    return {k: row.get(k) for k in keys}


def rank_pids(field: Any) -> list[tuple[int, int]]:
    """[(rank, pid)] from a finding's details["ranks"] (dicts with rank and pid); bad entries are left out."""
    out = []
    for entry in field if isinstance(field, list) else ():
        try:
            out.append((int(entry["rank"]), int(entry["pid"])))
        except (TypeError, KeyError, ValueError):
            continue
    return out


def with_run_diagnosis(finding: Finding, details: Mapping[str, Any]) -> Finding:
    """The hang finding with the run's diagnosis in its details, its verdict in the summary, the next
    steps as hint (English: logs and JSON; alerts say it from the details in the reader's language)."""
    return dataclasses.replace(finding, summary=f"{finding.summary} — {run_verdict_text(details, tr('en'))}",
                               details={**finding.details, **details, "diagnosis_timed_out": False},
                               hint=run_remedy_text(details, tr("en")))


# --- gathering (in the diagnoser's worker) ------------------------------------------------------

def pick(ranks: Sequence[tuple[int, int]], blocked: set[int], limit: int = MAX_RANKS) -> list[tuple[int, int]]:
    """At most `limit` ranks: those with a blocked thread first, the rest spread evenly over the run."""
    ranks = sorted(set(ranks))
    if len(ranks) <= limit:
        return ranks
    chosen = [r for r in ranks if r[1] in blocked][:limit]
    rest = [r for r in ranks if r not in chosen]
    room = limit - len(chosen)
    if room > 0:
        step = len(rest) / room
        chosen += [rest[int(i * step)] for i in range(room)]
    return sorted(chosen)


def _threads(proc_root: str, pid: int) -> tuple[bool, ThreadInfo | None]:
    """(whether a thread of the process is blocked on I/O, its main thread)."""
    threads = procs.read_threads(proc_root, pid)
    return any(t.blocked for t in threads), next((t for t in threads if t.tid == pid), None)


@dataclass
class Gatherer:
    """Reads one run's ranks: a first dump of each, a pause, /proc, a second dump; bounded by deadline_at."""

    proc_root: str = "/proc"
    py_spy: bool = True  # [gpu] py_spy: False reads /proc only
    py_spy_path: str | None = None
    children: Children | None = None
    interval: float = DUMP_INTERVAL_S
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _dump(self, pid: int, deadline_at: float) -> Mapping[int, Stack] | None:
        text = py_spy_dump(pid, min(DUMP_TIMEOUT_S, deadline_at - self.monotonic()), self.py_spy_path,
                           self.children)
        return parse_stacks(text) if text else None

    def _view(self, pid: int, probes: Sequence[FsSample], now: float) -> ProcessView | None:
        info = procs.inspect_process(self.proc_root, pid)
        if info is None:
            return None
        return view_process(pid, pid, "", None, info, None, probes, now,
                            flags=remote_fd_flags(self.proc_root, info))

    def gather(self, ranks: Sequence[tuple[int, int]], probes: Sequence[FsSample], now: float,
               deadline_at: float) -> dict[str, Any]:
        blocked = {pid for _, pid in ranks[:4 * MAX_RANKS] if _threads(self.proc_root, pid)[0]}
        chosen = pick(ranks, blocked)
        have = self.py_spy and bool(self.py_spy_path or shutil.which("py-spy"))
        first = {pid: self._dump(pid, deadline_at) for _, pid in chosen} if have else {}
        if have:
            self.sleep(max(0.0, min(self.interval, (deadline_at - self.monotonic()) / 3)))
        views = {pid: (self._view(pid, probes, now), _threads(self.proc_root, pid)[1]) for _, pid in chosen}
        second = {pid: self._dump(pid, deadline_at) for _, pid in chosen} if have else {}
        samples = [RankSample(rank, pid, *views[pid], first.get(pid), second.get(pid)) for rank, pid in chosen]
        read = any(v is not None for v in second.values())
        stacks = "py-spy" if read else "failed" if have else "missing" if self.py_spy else "off"
        return run_diagnosis(samples, stacks, len(ranks))
