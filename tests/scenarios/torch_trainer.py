"""A real, tiny PyTorch Lightning run for the rented-container scenario (CPU torch, no GPU needed).

A three-layer MLP learns a fixed synthetic classification task. Everything a real run
writes is real: Lightning's ``TensorBoardLogger`` (TensorBoard's own ``SummaryWriter``,
``log_every_n_steps=1``, so every step appends its scalars to ``events.out.tfevents.*``)
and ``ModelCheckpoint`` saving every ``--ckpt-seconds`` of training through trainguard's
Lightning integration: ``DiskGuard`` checks before each save and ``AtomicCheckpointIO``
writes aside, fsyncs and renames.

    python torch_trainer.py --root /root/autodl-tmp/runs/exp1 --steps 3000 \\
        --status /elsewhere/status.json --manifest /elsewhere/manifest.jsonl

``--root`` holds ``tb/`` (event files) and ``checkpoints/``. With ``--last-step-file`` the
run's length is set while it runs: once that file holds a step number (not behind the
current step), the run ends after that step, so a test can make a run as long as the
events it must live through take on a slow or a fast machine. The status file (JSON,
rewritten every few steps, on a disk not under test) says how far the run is; at the end
it also holds the measured steps/s (from step ``--warmup`` to the last step, so the
start-up is not counted). The manifest gets one JSON line per checkpoint: path, size,
sha256. Exit status 0 once every step has run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainguard.integrations.lightning import AtomicCheckpointIO, DiskGuard


class TinyNet(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        self.log("train/acc", (logits.argmax(1) == y).float().mean(), on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def synthetic_data(samples: int = 4096) -> TensorDataset:
    """A fixed learnable task: the label is which of ten random directions x points most along."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 64, generator=gen)
    directions = torch.randn(64, 10, generator=gen)
    return TensorDataset(x, (x @ directions).argmax(1))


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class ManifestCheckpointIO(AtomicCheckpointIO):
    """AtomicCheckpointIO that also records what it saved, so a test can check every copy."""

    def __init__(self, manifest: Path | None) -> None:
        super().__init__()
        self.manifest = manifest

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        if self.manifest is not None:
            entry = {"path": str(path), "size": os.path.getsize(path), "sha256": sha256_of(str(path)),
                     "step": checkpoint.get("global_step"), "saved_at": time.time()}
            with open(self.manifest, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")


class Progress(Callback):
    """Writes the step count (and at the end the measured rate) to a status file off the disks under test,
    and takes the run's last step from ``last_step_file`` once it appears."""

    def __init__(self, status: Path, warmup: int, last_step_file: Path | None, every: int = 10) -> None:
        self.status, self.warmup, self.every = status, warmup, every
        self.last_step_file = last_step_file
        self.started: float | None = None
        self.step = 0

    def write(self, **extra) -> None:
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "step": self.step, "at": time.time(), **extra}))
        os.replace(tmp, self.status)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step = trainer.global_step
        if self.step == self.warmup:
            self.started = time.monotonic()
        if self.step % self.every == 0:
            self.write()
            if self.last_step_file is not None and self.last_step_file.exists():
                # FitLoop.max_steps reads the epoch loop's; that one can be set
                trainer.fit_loop.epoch_loop.max_steps = max(int(self.last_step_file.read_text()), self.step)

    def on_train_end(self, trainer, pl_module) -> None:
        seconds = time.monotonic() - self.started if self.started is not None else None
        rate = (self.step - self.warmup) / seconds if seconds else None
        self.write(done=True, measured_steps=self.step - self.warmup, measured_seconds=seconds, steps_per_s=rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, required=True, help="the run's directory: tb/ and checkpoints/")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("--manifest", type=Path, default=None)
    parser.add_argument("--ckpt-seconds", type=float, default=2.0, help="save a checkpoint this often")
    parser.add_argument("--width", type=int, default=256, help="hidden width: sets the checkpoint size")
    parser.add_argument("--warmup", type=int, default=20, help="steps not counted in steps/s")
    parser.add_argument("--last-step-file", type=Path, default=None,
                        help="once this file holds a step number, the run ends after that step")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a small shared machine: one core for the model, the rest for the I/O
    args.root.mkdir(parents=True, exist_ok=True)
    checkpoints = ModelCheckpoint(dirpath=args.root / "checkpoints", filename="step-{step}",
                                  auto_insert_metric_name=False, save_top_k=-1,
                                  train_time_interval=timedelta(seconds=args.ckpt_seconds))
    progress = Progress(args.status, args.warmup, args.last_step_file)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps, max_epochs=-1, log_every_n_steps=1,
        logger=TensorBoardLogger(args.root, name="tb", version="exp1"),
        callbacks=[DiskGuard(reserve="2MiB"), checkpoints, progress],
        plugins=[ManifestCheckpointIO(args.manifest)],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    loader = DataLoader(synthetic_data(), batch_size=256, shuffle=True)
    trainer.fit(TinyNet(args.width), loader)
    planned = trainer.fit_loop.max_steps
    print(f"finished {trainer.global_step} of {planned} steps", flush=True)
    return 0 if trainer.global_step == planned else 1


if __name__ == "__main__":
    sys.exit(main())
