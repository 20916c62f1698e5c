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
    host_index = Holder(5, "e", uvm=True, env=(("NVIDIA_VISIBLE_DEVICES", "1"),))  # host-relative: no answer
    g1 = gpu(index=1, minor=1, uuid="GPU-bbbb")
    assert [h.pid for h in (on0, on1, everywhere, by_uuid, host_index) if uses(h, g1)] == [2, 3, 4]
    assert [h.pid for h in (on0, on1, everywhere) if uses(h, gpu(minor=None))] == [1, 2]


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
    assert not attribution.LIBRARY_PATTERN.search("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    assert attribution.LIBRARY_PATTERN.search("/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.15")


HOLDER = textwrap.dedent("""
    import mmap, os, sys
    dev, lib, what = sys.argv[1:4]
    names = {"cuda": ["nvidia7", "nvidiactl", "nvidia-uvm"], "monitor": ["nvidia7", "nvidiactl"]}[what]
    fds = [os.open(os.path.join(dev, n), os.O_RDWR) for n in names]
    if what == "cuda":
        fh = open(lib, "rb"); m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    print("ready", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def device_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    dev = tmp_path / "dev"
    dev.mkdir()
    # Real character devices with the NVIDIA names, all backed by the null device (1:3). The GPU node is
    # named nvidia7 but its device number says minor 3: the scan must take the minor from st_rdev.
    for name, minor in (("nvidia7", 3), ("nvidiactl", 3), ("nvidia-uvm", 3)):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, minor))
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
        # The GPU node's minor is the device number's, not the name's: 1:3 -> 3.
        assert h.minors == frozenset({3}) and h.uvm and h.libraries == (str(lib),)
        assert h.env == (("CUDA_VISIBLE_DEVICES", "0"),)
        assert uses(h, gpu(minor=3)) and not uses(h, gpu(minor=7))
    finally:
        for p in (cuda, monitor):
            p.kill()
            p.wait()
