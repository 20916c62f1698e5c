"""Holds what a CUDA process holds, then runs a Python script as __main__ in the same process.

A stand-in for a PyTorch job on a machine without a GPU: it opens /dev/nvidiaN,
/dev/nvidiactl and /dev/nvidia-uvm and maps each into memory, as a CUDA context does (in
tests/support/container.py's private /dev these are real character device nodes with the
NVIDIA names, backed by the zero device), maps a file named libcuda.so.1 the way the
dynamic loader maps the driver library, and sets CUDA_VISIBLE_DEVICES in its own
environment only when the caller did.

    python cuda_standin.py --minor 5 --lib /tmp/x/libcuda.so.1 -- tb_trainer.py --logdir ...
"""

from __future__ import annotations

import argparse
import mmap
import os
import runpy
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minor", type=int, required=True)
    parser.add_argument("--dev", default="/dev")
    parser.add_argument("--lib", required=True, help="a file named like the CUDA driver library")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    held = [os.open(f"{args.dev}/{name}", os.O_RDWR) for name in (f"nvidia{args.minor}", "nvidiactl", "nvidia-uvm")]
    # Private: a shared mapping of the zero device is listed as "/dev/zero (deleted)", not by the node.
    context = [mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE) for fd in held]
    with open(args.lib, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    sys.argv = [args.script, *[a for a in args.args if a != "--"]]
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        mapped.close()
        for region in context:
            region.close()
        for fd in held:
            os.close(fd)


if __name__ == "__main__":
    main()
