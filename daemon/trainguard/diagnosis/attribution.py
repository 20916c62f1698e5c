"""Which processes of our own PID namespace use a GPU, when NVML's PIDs do not say.

NVML reports host PIDs. In a container without the host PID namespace (AutoDL and
alike) those numbers mean nothing in our /proc, and some drivers report no process at
all. The GPU processes of our namespace are then found from what they hold, all read
from procfs without touching any filesystem they use:

- open /dev/nvidiaN (N = the GPU's minor number, nvmlDeviceGetMinorNumber), /dev/nvidia-uvm;
- the device nodes and driver libraries (libcuda.so*, libnvidia-*.so*) mapped in /proc/PID/maps,
  read only for processes that hold an NVIDIA device or set a CUDA variable;
- CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES in /proc/PID/environ (the environment the
  process started with) to narrow which GPU.

A process is a candidate when it maps an NVIDIA device node: a CUDA context maps
/dev/nvidiactl, /dev/nvidiaN and /dev/nvidia-uvm into memory. Opening them, or loading
libcuda, does not tell: with the 580 driver an NVML-only monitor (nvidia-smi, pynvml)
opens /dev/nvidia-uvm and loads libcuda too, and maps no node. trainguard itself is never
a candidate. The result is an inference, and says from what: nothing ever acts on such a PID.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from trainguard.records import GpuProcess, GpuSample
from trainguard.sources import procs
from trainguard.units import format_bytes

LIBRARY_PATTERN = re.compile(r"/(libcuda\.so[^/]*|libnvidia-(?!ml\.)[^/]*\.so[^/]*)$")
NODE_PATTERN = re.compile(r"/nvidia(\d+|ctl|-uvm)$")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


@dataclass(frozen=True, slots=True)
class DeviceFiles:
    """Where the NVIDIA device files are and which mapped libraries count (tests point these elsewhere)."""

    device_dir: str = "/dev"
    library: re.Pattern[str] = LIBRARY_PATTERN

    def mapped(self, path: str) -> bool:
        """A driver library or a device node, as /proc/PID/maps names them."""
        return bool(self.library.search(path)) or self.is_node(path)

    def is_node(self, path: str) -> bool:
        return path.startswith(self.device_dir.rstrip("/") + "/") and bool(NODE_PATTERN.search(path))

    def gpu_minor(self, target: str, fd_path: str) -> int | None:
        """N for an open <device_dir>/nvidiaN: the node's real minor number when it is a character device."""
        match = re.fullmatch(re.escape(self.device_dir.rstrip("/")) + r"/nvidia(\d+)", target)
        if match is None:
            return None
        try:
            st = os.stat(fd_path)  # only ever a device node: never a file on a (possibly hung) share
        except OSError:
            return int(match.group(1))
        return os.minor(st.st_rdev) if st.st_rdev else int(match.group(1))

    def is_uvm(self, target: str) -> bool:
        return target == self.device_dir.rstrip("/") + "/nvidia-uvm"

    def is_nvidia(self, target: str) -> bool:
        return target.startswith(self.device_dir.rstrip("/") + "/nvidia")


@dataclass(frozen=True, slots=True)
class Holder:
    """A process of our namespace and the NVIDIA things it holds."""

    pid: int
    cmdline: str
    minors: frozenset[int] = frozenset()
    uvm: bool = False
    libraries: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    nodes_mapped: tuple[str, ...] = ()

    @property
    def candidate(self) -> bool:
        return bool(self.nodes_mapped)

    def evidence(self) -> str:
        held = [f"/dev/nvidia{m}" for m in sorted(self.minors)] + (["/dev/nvidia-uvm"] if self.uvm else [])
        parts = [f"holds {', '.join(held)} open"] if held else []
        # The GPU's own node says most; nvidiactl and nvidia-uvm are mapped by every context.
        mapped = [p for p in self.nodes_mapped if p[-1].isdigit()]
        mapped += [os.path.basename(p) for p in self.libraries[:2]]
        if mapped:
            parts.append("maps " + ", ".join(mapped))
        parts += [f"{k}={v}" for k, v in self.env]
        return "; ".join(parts)

    def visible(self) -> tuple[set[str], bool] | None:
        """GPU names (indexes/UUIDs) its environment allows, and whether indexes count; None: no limit."""
        env = dict(self.env)
        if "CUDA_VISIBLE_DEVICES" in env:
            return {v.strip() for v in env["CUDA_VISIBLE_DEVICES"].split(",") if v.strip()}, True
        names = {v.strip() for v in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if v.strip()}
        # The container runtime's list, in host-relative indexes or UUIDs. Indexes cannot be compared
        # with our NVML view (in a container NVML counts from 0 again), so only a list of UUIDs narrows.
        if not names or not all(n.startswith(("GPU-", "MIG-")) for n in names):
            return None
        return names, False


@dataclass(frozen=True, slots=True)
class Inferred:
    """A candidate process on one GPU, and NVML's PID and memory when they pair one to one."""

    pid: int
    evidence: str
    host_pid: int | None = None
    used_memory_bytes: int | None = None


def is_trainguard(cmdline: Sequence[str]) -> bool:
    words = [os.path.basename(w) for w in cmdline[:3]]
    return "trainguard" in words or any(a == "-m" and b.startswith("trainguard")
                                        for a, b in zip(words, words[1:], strict=False))


def _holder(proc_root: str, pid: int, devices: DeviceFiles) -> Holder | None:
    minors: set[int] = set()
    uvm = nvidia = False
    for fd in procs.read_fds(proc_root, pid):
        if not devices.is_nvidia(fd.target):
            continue
        nvidia = True
        uvm = uvm or devices.is_uvm(fd.target)
        minor = devices.gpu_minor(fd.target, f"{proc_root}/{pid}/fd/{fd.fd}")
        if minor is not None:
            minors.add(minor)
    env = procs.read_environ(proc_root, pid, ENV_NAMES)
    if not nvidia and not env:
        return None
    mapped = procs.mapped_files(proc_root, pid, devices.mapped)
    cmdline = procs.read_cmdline(proc_root, pid)
    if is_trainguard(cmdline):
        return None
    return Holder(pid, " ".join(cmdline), frozenset(minors), uvm,
                  tuple(p for p in mapped if not devices.is_node(p)),
                  tuple((k, env[k]) for k in ENV_NAMES if k in env),
                  tuple(p for p in mapped if devices.is_node(p)))


DEFAULT_DEVICES = DeviceFiles()


def scan_holders(proc_root: str = "/proc", devices: DeviceFiles = DEFAULT_DEVICES,
                 exclude: Iterable[int] = ()) -> list[Holder]:
    """Every candidate GPU process visible in proc_root, trainguard itself left out."""
    skip = {os.getpid(), *exclude}
    found = []
    for pid in procs.list_pids(proc_root):
        if pid in skip:
            continue
        holder = _holder(proc_root, pid, devices)
        if holder is not None and holder.candidate:
            found.append(holder)
    return found


def uses(holder: Holder, gpu: GpuSample) -> bool:
    """Could this process be on this GPU? By the device minor it holds, then by its visible devices."""
    if holder.minors and gpu.minor_number is not None and gpu.minor_number not in holder.minors:
        return False
    allowed = holder.visible()
    if allowed is None:
        return True
    names, indexes_count = allowed
    return bool(gpu.uuid and gpu.uuid in names) or (indexes_count and str(gpu.index) in names)


CONTEXT_BYTES = 128 * 2**20  # less VRAM in use than one CUDA context holds: nobody is on the GPU


def needs_inference(gpu: GpuSample) -> bool:
    """NVML named a PID that does not resolve in our /proc (and is not known to be gone), or named no
    process while the GPU's memory is in use (some drivers report none inside containers)."""
    if gpu.processes:
        return any(p.pid is None and p.exists is not False for p in gpu.processes)
    return gpu.memory_used_bytes is None or gpu.memory_used_bytes >= CONTEXT_BYTES


def _memory(p: GpuProcess) -> str:
    return f", {format_bytes(p.used_memory_bytes)}" if p.used_memory_bytes is not None else ""


def attribute(gpu: GpuSample, holders: Sequence[Holder]) -> tuple[Inferred, ...]:
    """The candidates on this GPU. NVML's PID is a candidate's own PID here, or one NVML process and one
    candidate: that is it (PID and memory pair)."""
    if not needs_inference(gpu):
        return ()
    known = {p.pid for p in gpu.processes if p.pid is not None}
    on_gpu = [h for h in holders if h.pid not in known and uses(h, gpu)]
    unresolved = [p for p in gpu.processes if p.pid is None and p.exists is not False]
    # Some drivers give NVML's PIDs in the caller's PID namespace (the 580 driver did, in a new PID
    # namespace): a PID that is a candidate's own here pairs with it, so several ranks in one container
    # each find their GPU. A host PID equal to the PID here of another process with a CUDA context on
    # this GPU is possible, but unlikely; the evidence says which rule paired them.
    by_pid = {h.pid: h for h in on_gpu}
    same = [(p, by_pid[p.host_pid]) for p in unresolved if p.host_pid in by_pid]
    if same:
        paired = tuple(Inferred(h.pid, f"{h.evidence()}; NVML's PID {p.host_pid} is its PID here{_memory(p)}",
                                p.host_pid, p.used_memory_bytes) for p, h in same)
        left = tuple(p for p in gpu.processes if all(p is not q for q, _h in same))
        if not left:
            return paired
        taken = {h.pid for _p, h in same}
        return paired + attribute(replace(gpu, processes=left), [h for h in on_gpu if h.pid not in taken])
    if len(on_gpu) == 1 and len(unresolved) == 1:
        p, h = unresolved[0], on_gpu[0]
        return (Inferred(h.pid, f"{h.evidence()}; the only candidate for NVML's PID {p.host_pid}{_memory(p)}",
                         p.host_pid, p.used_memory_bytes),)
    if not gpu.processes and len(on_gpu) == 1:
        return (Inferred(on_gpu[0].pid, f"{on_gpu[0].evidence()}; NVML reported no process on this GPU",
                         None, gpu.memory_used_bytes),)
    return tuple(Inferred(h.pid, h.evidence() + f"; one of {len(on_gpu)} candidates") for h in on_gpu)
