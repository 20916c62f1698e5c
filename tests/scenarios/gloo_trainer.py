"""A real torch.distributed job on the gloo backend (CPU) for the hang scenarios, one process per rank
under torchrun (or, with --single, one process and no process group):

    python -m torch.distributed.run --standalone --nproc-per-node 4 gloo_trainer.py --out DIR \\
        --share-data /mnt/share/data.bin --share-rank 2

A tiny MLP trained with DistributedDataParallel: every backward pass is an all_reduce of the gradients,
so one rank that stops stops them all. Rank `--share-rank` reads each batch's bytes from `--share-data`
(a new MiB of the file each step, so the read really goes to the filesystem, not the page cache); the
others read from local disk. Rank `--loader-rank` takes its batches from a DataLoader worker that takes
the flock of `--loader-lock` for each one (a test holding it deadlocks the worker). Rank 0 writes
TensorBoard events (flushed each step) under DIR/tb, prints "step N" to its stdout, and saves a
checkpoint to `--ckpt-dir` every `--ckpt-every` steps. Files steer it: `--start-file` (training starts
once it exists: a slow start-up), `--eval-file` (while it exists: forward passes that log nothing),
`--crash-file` (rank 0 raises), `--save-file` (while it exists, rank 0 writes a checkpoint to `--save-to`
chunk by chunk: a long save). Each rank writes its PID to DIR/rankR.pid once it is up.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.tensorboard import SummaryWriter

STRIDE = 1 << 20


def batch(fd: int, step: int) -> torch.Tensor:
    data = os.pread(fd, 64 * 4, (step * STRIDE) % (1 << 30))
    raw = torch.frombuffer(bytearray(data.ljust(64 * 4, b"\0")), dtype=torch.uint8).float()
    return raw.view(4, 64) / 255.0


class Locked(IterableDataset):
    """Endless batches, each made under an exclusive flock of `lock`."""

    def __init__(self, lock: str) -> None:
        self.lock = lock

    def __iter__(self):
        while True:
            with open(self.lock, "rb") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fcntl.flock(fh, fcntl.LOCK_UN)
            yield torch.rand(4, 64)


def slow_save(while_exists: Path, to: Path) -> None:
    """A long checkpoint save: rank 0 writes chunk after chunk while the others wait in all_reduce."""
    with open(to, "wb") as fh:
        while while_exists.exists():
            fh.write(os.urandom(1 << 16))
            fh.flush()
            time.sleep(0.05)


def args_of() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--share-data", default="")
    ap.add_argument("--share-rank", type=int, default=-1)
    ap.add_argument("--loader-rank", type=int, default=-1)
    ap.add_argument("--loader-lock", default="")
    ap.add_argument("--ckpt-dir", type=Path)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--start-file", type=Path)
    ap.add_argument("--eval-file", type=Path)
    ap.add_argument("--crash-file", type=Path)
    ap.add_argument("--save-file", type=Path)
    ap.add_argument("--save-to", type=Path)
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--step-seconds", type=float, default=0.05)
    return ap.parse_args()


def main() -> None:
    args = args_of()
    rank = 0
    model: nn.Module = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    torch.manual_seed(0)
    if not args.single:
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    local = args.out / f"data{rank}.bin"
    local.write_bytes(os.urandom(1 << 16))
    fd = os.open(args.share_data if rank == args.share_rank else local, os.O_RDONLY)
    loader = iter(DataLoader(Locked(args.loader_lock), batch_size=None, num_workers=1)) \
        if rank == args.loader_rank else None
    writer = SummaryWriter(str(args.out / "tb"), flush_secs=3600) if rank == 0 else None
    (args.out / f"rank{rank}.pid").write_text(str(os.getpid()))
    while args.start_file and not args.start_file.exists():
        time.sleep(0.05)
    step = 0
    while True:
        if args.eval_file and args.eval_file.exists():
            with torch.no_grad():
                model(batch(fd, 0))  # evaluation: computes, logs nothing
            time.sleep(args.step_seconds)
            continue
        if rank == 0 and args.save_file and args.save_file.exists():
            slow_save(args.save_file, args.save_to)
        if rank == 0 and args.crash_file and args.crash_file.exists():
            raise RuntimeError(f"loss is nan at step {step}")
        x = next(loader) if loader is not None else batch(fd, step if rank == args.share_rank else 0)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # all_reduce of the gradients: every rank waits for the slowest
        opt.step()
        step += 1
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
            writer.flush()
            print(f"step {step}", flush=True)
            if args.ckpt_dir and step % args.ckpt_every == 0:
                torch.save(model.state_dict(), args.ckpt_dir / "last.pt")
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()
