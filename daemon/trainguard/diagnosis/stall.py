"""Why is this GPU stalled? The diagnosis attached to a gpu.stall alert.

StallDiagnoser gathers the inputs (/proc reads, optional py-spy, the attribution of GPU
processes in our own PID namespace when NVML's PIDs do not resolve) and hands them to the
pure parts: diagnosis.threads (one process), diagnosis.verdict (the verdict line and
remedy), diagnosis.render (the screen). In the daemon the gathering runs in a bounded
worker (diagnosis.worker) with a deadline, so a slow /proc read or py-spy never holds the
cycle; an alert whose diagnosis is late goes out with what is known and says so.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Hashable, NamedTuple, Sequence

from trainguard.detectors.progress import HANG_PREFIX
from trainguard.diagnosis import attribution
from trainguard.diagnosis.attribution import DeviceFiles
from trainguard.diagnosis.model import (
    Diagnosis,
    FileView,
    ProcessView,
    ThreadView,
    file_category,
)
from trainguard.diagnosis.placement import GpuProcessRef, risky_writes
from trainguard.diagnosis.ranks import Gatherer, rank_pids, with_run_diagnosis
from trainguard.diagnosis.render import render
from trainguard.diagnosis.threads import (
    parse_py_spy_dump,
    python_thread_names,
    remote_fd_flags,
    view_process,
)
from trainguard.diagnosis.verdict import EN, build_diagnosis, timed_out, verdict_and_remedy
from trainguard.diagnosis.words import owner_text
from trainguard.diagnosis.worker import BoundedWorker, Children
from trainguard.records import Finding, GpuSample, Snapshot
from trainguard.sources import procs
from trainguard.sources.procs import IoCounters

__all__ = ["Diagnosis", "FileView", "ProcessView", "StallDiagnoser", "ThreadView", "build_diagnosis",
           "file_category", "parse_py_spy_dump", "python_thread_names", "render", "verdict_and_remedy",
           "view_process"]

DEADLINE_S = 5.0  # the longest a stall alert (or `trainguard diagnose`) waits for its diagnosis
BUDGET_S = 10.0  # the time a diagnosis job gives py-spy and the I/O probe; past DEADLINE_S it runs on alone
PY_SPY_TIMEOUT_S = 5.0
IO_PROBE_S = 1.0  # two I/O readings this far apart when there is no earlier one
RUN_BUDGET_S = 20.0  # a run's diagnosis: two py-spy dumps of up to 16 ranks, some seconds apart


class Target(NamedTuple):
    host_pid: int | None
    pid: int | None
    note: str
    used_memory: int | None
    inferred_from: str = ""


def _util(gpu: GpuSample) -> tuple[float, ...]:
    return tuple(u for u in (gpu.util_ratio,) if u is not None)


BUSY = 0.5  # utilisation above which a GPU is working, whatever a stall rule's floor


def _busy(gpu: GpuSample) -> bool:
    return gpu.util_ratio is not None and gpu.util_ratio > BUSY


class StallDiagnoser:
    """Keeps I/O counters of GPU processes across cycles and diagnoses stalls on demand."""

    def __init__(self, proc_root: str = "/proc", *, window: float = 300.0, py_spy: bool = True,
                 clock: Callable[[], float] = time.time, machine: str | None = None,
                 deadline: float = DEADLINE_S, devices: DeviceFiles = attribution.DEFAULT_DEVICES,
                 monotonic: Callable[[], float] = time.monotonic, py_spy_path: str | None = None):
        self.proc_root = proc_root
        self.window = window
        self.py_spy = py_spy
        self.py_spy_path = py_spy_path  # None: py-spy on PATH
        self.clock = clock
        self.machine = machine
        self.deadline = deadline
        self.devices = devices
        self.monotonic = monotonic
        self.worker = BoundedWorker(monotonic=monotonic)
        self.children = Children()
        self.gatherer = Gatherer(proc_root, py_spy, py_spy_path, self.children, monotonic=monotonic)
        self._runs: dict[str, tuple[float, dict]] = {}  # train.hang key -> (asked at, the run's diagnosis)
        self._io: dict[int, collections.deque[tuple[float, IoCounters]]] = {}
        self._watch: set[int] = set()  # inferred GPU processes: their I/O is read every cycle too
        self._lock = threading.Lock()  # _io and _watch: the cycle writes, the worker reads
        # A firing stall is re-diagnosed at most this often (thread scans and py-spy are not free).
        self.refresh = 60.0
        self._cache: dict[int, tuple[float, Diagnosis]] = {}
        self._late: set[str] = set()  # stall keys whose alert carried a timed-out diagnosis
        self._updates: set[str] = set()  # ... and whose full diagnosis has arrived since
        self._placement: tuple[float, list[Finding]] = (float("-inf"), [])

    # --- I/O counters across cycles ---------------------------------------------------------

    def observe(self, snapshot: Snapshot) -> None:
        """Record I/O counters of the resolved GPU processes of every GPU that is not busy, and of the
        inferred ones (one small read each). A busy GPU is not stalled: its processes' counters are
        needed from the moment it goes quiet, which is as far back as a stall diagnosis looks."""
        with self._lock:
            pids = {p.pid for g in snapshot.gpus if not _busy(g) for p in g.processes if p.pid is not None}
            pids |= self._watch
            for pid in pids:
                io = procs.read_io(self.proc_root, pid)
                if io is None:
                    self._watch.discard(pid)
                    continue
                ring = self._io.setdefault(pid, collections.deque())
                ring.append((snapshot.ts, io))
                while len(ring) > 1 and ring[1][0] <= snapshot.ts - self.window:
                    ring.popleft()
            for pid in list(self._io):
                if pid not in pids:
                    del self._io[pid]

    def watch_inferred(self, gpus: Sequence[GpuSample]) -> None:
        """Find the inferred GPU processes now (in the worker, at most the deadline) so that the next
        observe() reads their I/O counters too: a one-shot diagnose then needs no extra I/O probe."""
        wanted = [g for g in gpus if attribution.needs_inference(g)]
        if wanted:
            job = self.worker.submit("watch", lambda: [self.targets(g) for g in wanted])
            if job is not None:
                job.wait(self.deadline)

    def io_before(self, pid: int) -> IoCounters | None:
        with self._lock:
            ring = self._io.get(pid)
            return ring[0][1] if ring else None

    # --- the slow part (a worker thread in the daemon) -------------------------------------

    def targets(self, gpu: GpuSample) -> list[Target]:
        """The processes to inspect: NVML's resolved PIDs, and when some do not resolve (or NVML names
        none) the candidates of our namespace, inferred from the NVIDIA files they hold."""
        out = [Target(p.host_pid, p.pid, p.note, p.used_memory_bytes) for p in gpu.processes if p.pid is not None]
        if not attribution.needs_inference(gpu):
            return out
        inferred = attribution.attribute(gpu, attribution.scan_holders(self.proc_root, self.devices))
        with self._lock:
            self._watch.update(i.pid for i in inferred)
        paired = {i.host_pid for i in inferred}
        out += [Target(p.host_pid, None, p.note, p.used_memory_bytes)
                for p in gpu.processes if p.pid is None and p.host_pid not in paired]
        out += [Target(i.host_pid, i.pid, "", i.used_memory_bytes, i.evidence) for i in inferred]
        return out

    def _view(self, t: Target, snapshot: Snapshot, now: float, deadline_at: float) -> ProcessView:
        info = procs.inspect_process(self.proc_root, t.pid, self.machine) if t.pid is not None else None
        if info is None:
            return view_process(t.host_pid, t.pid, t.note, t.used_memory, None, None, (), now,
                                inferred_from=t.inferred_from)
        before = self.io_before(t.pid) if t.pid is not None else None
        if before is None and info.io is not None:
            time.sleep(max(0.0, min(IO_PROBE_S, (deadline_at - self.monotonic()) / 4)))
            before, info = info.io, dataclasses.replace(info, io=procs.read_io(self.proc_root, info.pid))
        py_names = {}
        if self.py_spy and any(thread.blocked for thread in info.threads):
            py_names = python_thread_names(info.pid, min(PY_SPY_TIMEOUT_S, deadline_at - self.monotonic()),
                                           self.py_spy_path, self.children)
        return view_process(t.host_pid, t.pid, t.note, t.used_memory, info, before, snapshot.filesystems, now,
                            py_names, flags=remote_fd_flags(self.proc_root, info), inferred_from=t.inferred_from)

    def diagnose(self, gpu: GpuSample, snapshot: Snapshot, now: float | None = None,
                 util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
        """The full diagnosis, synchronously (the worker runs this; so does a test)."""
        now = self.clock() if now is None else now
        deadline_at = self.monotonic() + BUDGET_S
        views = [self._view(t, snapshot, now, deadline_at) for t in self.targets(gpu)]
        return build_diagnosis(gpu, views, snapshot.log_matches, util_recent, stalled_for_s)

    def diagnose_within(self, gpus: Sequence[GpuSample], snapshot: Snapshot,
                        now: float | None = None) -> list[Diagnosis]:
        """diagnose() of each GPU in the worker, all waited for at most the deadline together; a late one
        is what is known without /proc, marked timed out (trainguard diagnose)."""
        when = self.clock() if now is None else now
        wait_until = self.monotonic() + self.deadline
        jobs = [(g, self.worker.submit(("diagnose", g.index),
                                       lambda g=g: self.diagnose(g, snapshot, when, _util(g)))) for g in gpus]
        out = []
        for gpu, job in jobs:
            if job is not None and job.wait(wait_until - self.monotonic()) and job.result is not None:
                out.append(job.result)
            else:
                out.append(timed_out(gpu, snapshot.filesystems, snapshot.log_matches, self.deadline, _util(gpu)))
        return out

    def close(self) -> None:
        """Kill and reap any py-spy still running; jobs stuck in a /proc read are left to the kernel."""
        self.children.kill_all()

    # --- the cycle's side: never blocks past the deadline ----------------------------------

    def _harvest(self, index: Hashable, cache: dict | None = None, kind: str = "stall") -> tuple[float, Any] | None:
        """The newest result for a key: cached, or the worker's finished job when newer."""
        cache = self._cache if cache is None else cache
        cached = cache.get(index)
        job = self.worker.latest((kind, index))
        if job is not None and job.done and job.result is not None and (cached is None or job.tag > cached[0]):
            cached = cache[index] = (job.tag, job.result)
        return cached

    def _diagnosis_for(self, gpu: GpuSample, snapshot: Snapshot, when: float, util: tuple[float, ...],
                       stalled: float | None, wait_until: float) -> Diagnosis:
        cached = self._harvest(gpu.index)
        if cached is not None and when - cached[0] < self.refresh:
            return dataclasses.replace(cached[1], util_recent=util, stalled_for_s=stalled)
        job = self.worker.submit(("stall", gpu.index),
                                 lambda: self.diagnose(gpu, snapshot, when, util, stalled), tag=when)
        if cached is not None:  # a refresh: the previous diagnosis goes on until the new one is in
            return dataclasses.replace(cached[1], util_recent=util, stalled_for_s=stalled)
        if job is not None and job.wait(min(wait_until, job.started + self.deadline) - self.monotonic()):
            cached = self._harvest(gpu.index)
            if cached is not None:
                return dataclasses.replace(cached[1], util_recent=util, stalled_for_s=stalled)
        return timed_out(gpu, snapshot.filesystems, snapshot.log_matches, self.deadline, util, stalled)

    def enrich(self, findings: Sequence[Finding], snapshot: Snapshot, now: float | None = None) -> list[Finding]:
        """Attach a diagnosis to every gpu.stall finding: details, verdict in summary, remedy as hint.

        Waits for a new stall's diagnosis at most `deadline` seconds in all; a refresh never waits."""
        gpus = {g.index: g for g in snapshot.gpus}
        stalled = {int(f.details.get("gpu", -1)) for f in findings if f.kind == "gpu.stall"}
        for index in list(self._cache):
            if index not in stalled:
                del self._cache[index]  # a new stall gets a fresh diagnosis
        self._late &= {f.key for f in findings}
        for key in list(self._runs):
            if all(f.key != key for f in findings):
                del self._runs[key]
        wait_until = self.monotonic() + self.deadline
        out = []
        for finding in findings:
            if finding.key.startswith(HANG_PREFIX):
                out.append(self._enrich_hang(finding, snapshot, now, wait_until))
                continue
            gpu = gpus.get(int(finding.details.get("gpu", -1))) if finding.kind == "gpu.stall" else None
            if gpu is None:
                out.append(finding)
                continue
            when = self.clock() if now is None else now
            d = self._diagnosis_for(gpu, snapshot, when, tuple(finding.details.get("util_recent", ())),
                                    finding.details.get("stalled_for_s"), wait_until)
            if d.timed_out:
                self._late.add(finding.key)
            elif finding.key in self._late:
                self._late.discard(finding.key)
                self._updates.add(finding.key)
            details = {**finding.details, "diagnosis": d.to_dict(), "verdict": d.verdict,
                       "attribution": d.attribution, "diagnosis_timed_out": d.timed_out, "owners": d.owners()}
            owned = f"; {owner_text(details['owners'][0], EN)}" if details["owners"] else ""
            out.append(dataclasses.replace(finding, summary=f"{finding.summary} — {d.verdict}{owned}",
                                           details=details, hint=d.remedy))
        return out

    def _enrich_hang(self, finding: Finding, snapshot: Snapshot, now: float | None, wait_until: float) -> Finding:
        """A run's hang with the rank that holds the others (diagnosis.ranks), waited for as a stall's is."""
        ranks = rank_pids(finding.details.get("ranks"))
        if not ranks:
            return finding
        when = self.clock() if now is None else now
        cached = self._harvest(finding.key, self._runs, "ranks")
        if cached is None or when - cached[0] >= self.refresh:
            job = self.worker.submit(("ranks", finding.key), lambda: self.gatherer.gather(
                ranks, snapshot.filesystems, when, self.monotonic() + RUN_BUDGET_S), tag=when)
            if cached is None and job is not None:
                job.wait(min(wait_until, job.started + self.deadline) - self.monotonic())
                cached = self._harvest(finding.key, self._runs, "ranks")
        if cached is None:
            self._late.add(finding.key)
            return dataclasses.replace(finding, details={**finding.details, "diagnosis_timed_out": True})
        if finding.key in self._late:
            self._late.discard(finding.key)
            self._updates.add(finding.key)
        return with_run_diagnosis(finding, cached[1])

    def take_updates(self) -> set[str]:
        """Keys of stall alerts sent with a timed-out diagnosis whose full one is now attached: send again."""
        updates, self._updates = self._updates, set()
        return updates

    # --- prevention --------------------------------------------------------------------------

    def gpu_processes(self, snapshot: Snapshot) -> list[GpuProcessRef]:
        """Every GPU process we can inspect: NVML's resolved PIDs and the inferred ones."""
        refs = [GpuProcessRef(p.pid, g.index) for g in snapshot.gpus for p in g.processes if p.pid is not None]
        unresolved = [g for g in snapshot.gpus if not g.lost and attribution.needs_inference(g)]
        if unresolved:
            holders = attribution.scan_holders(self.proc_root, self.devices)
            refs += [GpuProcessRef(i.pid, g.index, i.evidence) for g in unresolved
                     for i in attribution.attribute(g, holders)]
        return refs

    def risky_writes(self, snapshot: Snapshot, now: float | None = None) -> list[Finding]:
        """gpu.risky_write findings now, synchronously."""
        now = self.clock() if now is None else now
        return risky_writes(self.gpu_processes(snapshot), self.proc_root, snapshot.filesystems, now)

    def placement(self, snapshot: Snapshot, now: float | None = None) -> list[Finding]:
        """The latest risky-write findings; a new scan runs in the worker every `refresh` seconds."""
        now = self.clock() if now is None else now
        if not snapshot.gpus:
            return []
        job = self.worker.latest("placement")
        if job is not None and job.done and job.result is not None and job.tag > self._placement[0]:
            self._placement = (job.tag, job.result)
        if now - self._placement[0] >= self.refresh:
            self.worker.submit("placement", lambda: self.risky_writes(snapshot, now), tag=now)
        return list(self._placement[1])
