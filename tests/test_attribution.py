"""Which process of our namespace is on a GPU when NVML's PIDs do not say: the pure rules, and a scan
of real processes holding real character-device stand-ins for /dev/nvidia* in a private directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from trainguard.diagnosis import attribution
from trainguard.diagnosis.attribution import (
    DeviceFiles,
    Holder,
    attribute,
    is_trainguard,
    needs_inference,
    uses,
)
from trainguard.records import GpuProcess, GpuSample

GiB = 2**30


def gpu(index=0, minor=0, processes=(), used=40 * GiB, uuid="GPU-aaaa"):
    return GpuSample(index, uuid, "A100", 0.0, memory_used_bytes=used, processes=tuple(processes),
                     minor_number=minor)


def unresolved(host_pid, used=40 * GiB, exists=None):
    return GpuProcess(host_pid, None, used, exists=exists, note=f"host PID {host_pid} cannot be resolved")


def test_one_candidate_for_one_unresolved_pid_pairs_pid_and_memory():
    h = Holder(42, "python train.py", frozenset({0}), uvm=True, libraries=("/usr/lib/libcuda.so.1",))
    (i,) = attribute(gpu(processes=[unresolved(9001)]), [h])
    assert (i.pid, i.host_pid, i.used_memory_bytes) == (42, 9001, 40 * GiB)
    assert i.evidence.startswith("holds /dev/nvidia0, /dev/nvidia-uvm open; maps libcuda.so.1")
    assert "the only candidate for NVML's PID 9001, 40.0 GiB" in i.evidence


def test_the_device_minor_and_visible_devices_pick_the_gpu():
    on0 = Holder(1, "a", frozenset({0}), uvm=True)
    on1 = Holder(2, "b", frozenset({1}), uvm=True)
    everywhere = Holder(3, "c", frozenset({0, 1}), uvm=True, env=(("CUDA_VISIBLE_DEVICES", "1"),))
    by_uuid = Holder(4, "d", uvm=True, env=(("NVIDIA_VISIBLE_DEVICES", "GPU-bbbb"),))
    other_uuid = Holder(5, "e", uvm=True, env=(("NVIDIA_VISIBLE_DEVICES", "GPU-aaaa,GPU-cccc"),))
    g1 = gpu(index=1, minor=1, uuid="GPU-bbbb")
    assert [h.pid for h in (on0, on1, everywhere, by_uuid, other_uuid) if uses(h, g1)] == [2, 3, 4]
    assert [h.pid for h in (on0, on1, everywhere) if uses(h, gpu(minor=None))] == [1, 2]


@pytest.mark.parametrize("value", ["0", "1", "0,1", "all", "", "GPU-aaaa,1"])
def test_a_container_runtime_list_of_host_indexes_narrows_nothing(value):
    # As a real driver's container shows it: the runtime sets NVIDIA_VISIBLE_DEVICES=0 for every process,
    # in host indexes, while NVML inside counts from 0 again. Only UUIDs can be compared.
    h = Holder(5, "python train.py", frozenset({1}), uvm=True, env=(("NVIDIA_VISIBLE_DEVICES", value),))
    assert uses(h, gpu(index=1, minor=1, uuid="GPU-bbbb"))


def test_nvml_pids_given_in_our_namespace_pair_each_candidate_with_its_own():
    # As the 580 driver reported them in a new PID namespace: NVML's PIDs are the processes' PIDs here.
    # Two ranks, both on both GPUs by the devices they hold: each pairs by its own PID, not "one of 2".
    ranks = [Holder(12, "rank0", frozenset({0, 1}), nodes_mapped=("/dev/nvidia0",)),
             Holder(13, "rank1", frozenset({0, 1}), nodes_mapped=("/dev/nvidia1",))]
    for index, pid in ((0, 12), (1, 13)):
        (i,) = attribute(gpu(index, minor=index, processes=[unresolved(pid)]), ranks)
        assert (i.pid, i.host_pid, i.used_memory_bytes) == (pid, pid, 40 * GiB)
        assert f"NVML's PID {pid} is its PID here, 40.0 GiB" in i.evidence
    # An NVML PID that is nobody's here still goes by the other rules, beside the one that paired.
    found = attribute(gpu(processes=[unresolved(12), unresolved(9001)]), ranks)
    assert [(i.pid, i.host_pid) for i in found] == [(12, 12), (13, 9001)]
    assert "the only candidate for NVML's PID 9001" in found[1].evidence


def test_several_candidates_are_each_marked_and_not_paired():
    hs = [Holder(1, "a", uvm=True), Holder(2, "b", uvm=True)]
    found = attribute(gpu(processes=[unresolved(7), unresolved(8)]), hs)
    assert [(i.pid, i.host_pid) for i in found] == [(1, None), (2, None)]
    assert all("one of 2 candidates" in i.evidence for i in found)


def test_when_inference_is_needed():
    assert needs_inference(gpu(processes=[unresolved(7)]))
    assert not needs_inference(gpu(processes=[GpuProcess(7, 7, GiB)]))  # NVML's PID resolves
    assert not needs_inference(gpu(processes=[unresolved(7, exists=False)]))  # host view: it is gone
    assert needs_inference(gpu(processes=[], used=40 * GiB))  # a driver that reports no processes
    assert not needs_inference(gpu(processes=[], used=3 * 2**20))  # an idle GPU
    assert attribute(gpu(processes=[], used=3 * 2**20), [Holder(1, "a", uvm=True)]) == ()


def test_trainguard_itself_and_nvml_only_monitors_are_not_candidates():
    assert is_trainguard(["/usr/bin/python3", "-m", "trainguard", "run"])
    assert is_trainguard(["/opt/trainguard/bin/trainguard", "diagnose"])
    assert not is_trainguard(["python", "train.py", "--name", "trainguard"])
    assert not Holder(1, "nvidia-smi", frozenset({0})).candidate  # device open, no UVM, no CUDA driver
    # The 580 driver's NVML opens nvidia-uvm and loads libcuda too; it maps no device node.
    assert not Holder(1, "nvidia-smi", frozenset({0}), uvm=True, libraries=("/usr/lib/libcuda.so.1",)).candidate
    assert Holder(1, "python train.py", frozenset({0}), nodes_mapped=("/dev/nvidiactl",)).candidate
    assert not attribution.LIBRARY_PATTERN.search("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    assert attribution.LIBRARY_PATTERN.search("/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.15")


# As the 580 driver shows them: a process with a CUDA context and an NVML-only monitor both open
# the GPU's node, nvidiactl and nvidia-uvm and map libcuda; only the context maps the nodes.
HOLDER = textwrap.dedent("""
    import mmap, os, sys
    dev, lib, what = sys.argv[1:4]
    fds = [os.open(os.path.join(dev, n), os.O_RDWR) for n in ["nvidia7", "nvidiactl", "nvidia-uvm"]]
    fh = open(lib, "rb"); m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    if what == "cuda":
        context = [mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE) for fd in fds]  # shared: "/dev/zero (deleted)"
    print("ready", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def device_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    dev = tmp_path / "dev"
    dev.mkdir()
    # Real character devices with the NVIDIA names, all backed by the zero device (1:5), which can be
    # mapped. The GPU node is named nvidia7 but its device number says minor 5: the scan must take the
    # minor from st_rdev.
    for name in ("nvidia7", "nvidiactl", "nvidia-uvm"):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 5))
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    return dev, lib


def _start(dev, lib, what, env=None):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(dev), str(lib), what], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_scan_finds_the_cuda_process_by_what_it_holds(device_dir):
    dev, lib = device_dir
    cuda = _start(dev, lib, "cuda", env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    monitor = _start(dev, lib, "monitor")
    try:
        found = {h.pid: h for h in attribution.scan_holders("/proc", DeviceFiles(device_dir=str(dev)))}
        assert monitor.pid not in found and os.getpid() not in found
        h = found[cuda.pid]
        # The GPU node's minor is the device number's, not the name's: 1:5 -> 5.
        assert h.minors == frozenset({5}) and h.uvm and h.libraries == (str(lib),)
        assert sorted(h.nodes_mapped) == sorted(str(dev / n) for n in ("nvidia7", "nvidiactl", "nvidia-uvm"))
        assert h.env == (("CUDA_VISIBLE_DEVICES", "0"),)
        assert f"maps {dev}/nvidia7, libcuda.so.1" in h.evidence()
        assert uses(h, gpu(minor=5)) and not uses(h, gpu(minor=7))
    finally:
        for p in (cuda, monitor):
            p.kill()
            p.wait()
