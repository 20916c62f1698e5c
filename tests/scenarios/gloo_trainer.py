"""A real torch.distributed job on the gloo backend (CPU) for the hang scenarios, one process per rank
under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 4 gloo_trainer.py --out DIR \\
        --share-data /mnt/share/data.bin --share-rank 2

A tiny MLP trained with DistributedDataParallel: every backward pass is an all_reduce of the gradients,
so one rank that stops stops them all. Rank `--share-rank` reads each batch's bytes from `--share-data`
(a new MiB of the file each step, so the read really goes to the filesystem, not the page cache); the
others read from local disk. Rank 0 writes TensorBoard events (flushed each step) under DIR/tb and
prints "step N" to its stdout. Each rank writes its PID to DIR/rankR.pid once it is up.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

STRIDE = 1 << 20


def batch(fd: int, step: int) -> torch.Tensor:
    data = os.pread(fd, 64 * 4, (step * STRIDE) % (1 << 30))
    raw = torch.frombuffer(bytearray(data.ljust(64 * 4, b"\0")), dtype=torch.uint8).float()
    return raw.view(4, 64) / 255.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--share-data", required=True)
    ap.add_argument("--share-rank", type=int, default=2)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    local = args.out / f"data{rank}.bin"
    local.write_bytes(os.urandom(1 << 16))
    fd = os.open(args.share_data if rank == args.share_rank else local, os.O_RDONLY)
    writer = SummaryWriter(str(args.out / "tb"), flush_secs=3600) if rank == 0 else None
    (args.out / f"rank{rank}.pid").write_text(str(os.getpid()))
    step = 0
    while True:
        x = batch(fd, step if rank == args.share_rank else 0)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # all_reduce of the gradients: every rank waits for the slowest
        opt.step()
        step += 1
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
            writer.flush()
            print(f"step {step}", flush=True)
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()
