"""A container-like place for a process: a new PID namespace with its own /proc (unshare --pid --fork
--mount-proc) and a private /dev that holds NVIDIA device stand-ins.

That is what a rented GPU container (AutoDL and alike) looks like from inside: its
processes see only each other, NVML reports host PIDs that mean nothing there, and
/dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-uvm are device nodes in the container's own
/dev. Here those nodes are real character devices with the NVIDIA names, backed by the
zero device (1:5), which can be mapped into memory as a CUDA context maps the real ones:
without an NVIDIA driver a node with major 195 cannot be opened, and the code under test
reads the path and st_rdev's minor, never the major. So the GPU node is /dev/nvidia5 and
the scripted GPU's minor number must be GPU_MINOR (5). Nothing leaks out: the mount
namespace is private.

    with GpuContainer(["python", "job.py"]) as box:
        box.exec(["python", "-m", "trainguard", "diagnose"])   # like `docker exec`
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Sequence

GPU_MINOR = 5  # the zero device's minor: /dev/nvidia5 is c 1:5

SETUP = """
set -e
mount -t tmpfs -o mode=755 trainguard-test-dev /dev
for node in null:3 zero:5 random:8 urandom:9; do mknod -m 666 /dev/${node%:*} c 1 ${node#*:}; done
ln -s /proc/self/fd /dev/fd; ln -s fd/0 /dev/stdin; ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
for name in nvidia5 nvidiactl nvidia-uvm; do mknod -m 666 /dev/$name c 1 5; done
"$@" &
wait $!
"""


def container_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare --pid --mount, mknod)"
    for tool in ("unshare", "nsenter", "mknod"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux/coreutils) is not installed"
    return None


class GpuContainer:
    def __init__(self, command: Sequence[str], *, env: dict[str, str] | None = None):
        self.command = list(command)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None  # the namespace's PID 1, as this (outer) namespace numbers it

    def __enter__(self) -> GpuContainer:
        env = dict(self.env or os.environ)
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                                      "sh", "-c", SETUP, "sh", *self.command], env=env)
        deadline = time.monotonic() + 10
        while self.init_pid is None:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as fh:
                    children = fh.read().split()
            except OSError:
                children = []
            if children:
                self.init_pid = int(children[0])
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"unshare did not start (exit {self.proc.returncode})")
            else:
                time.sleep(0.02)
        return self

    def exec(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
        """Run argv inside the container's PID and mount namespaces and wait for it."""
        return subprocess.run(["nsenter", "--target", str(self.init_pid), "--pid", "--mount", "--", *argv],
                              capture_output=True, text=True, **kwargs)

    def __exit__(self, *exc_info: object) -> None:
        if self.init_pid is not None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)  # the namespace's init: every process in it goes
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
