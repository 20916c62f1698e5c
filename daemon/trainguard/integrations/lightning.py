"""Lightning: a Callback that stops a run before the disk cannot hold the next checkpoint, and a
CheckpointIO that writes every checkpoint aside and renames it into place.

    from trainguard.integrations.lightning import AtomicCheckpointIO, DiskGuard
    trainer = Trainer(..., callbacks=[DiskGuard(reserve="5GiB")], plugins=[AtomicCheckpointIO()])

Lightning runs checkpoint callbacks after all others in each hook, so DiskGuard's
on_train_batch_end sees the state before ModelCheckpoint saves. When the next checkpoint fits
but the one after it would not, it sets trainer.should_stop (as EarlyStopping does): Lightning
finishes the step, ModelCheckpoint saves, and fit() returns. When not even this one fits, it
also marks this step as saved for each ModelCheckpoint, so nothing is written half-way.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from trainguard.guard import progress, save_checkpoint
from trainguard.guard.space import Reserve
from trainguard.integrations.common import (
    GO,
    STOP,
    Verdict,
    decide,
    estimate,
    report_stop,
)


class DiskGuard(Callback):
    def __init__(self, reserve: Reserve = None, *, dirpath: str | None = None, state_dir: str | None = None):
        self.reserve = reserve
        self.dirpath = dirpath
        self.state_dir = state_dir
        self.stopped: Verdict | None = None  # why the run was stopped, once it was

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        progress(trainer.global_step, state_dir=self.state_dir)  # the progress watchdog's heartbeat
        self._check(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    def _directory(self, trainer) -> str:
        if self.dirpath:
            return self.dirpath
        callback = trainer.checkpoint_callback
        return str(getattr(callback, "dirpath", None) or trainer.default_root_dir)

    def _check(self, trainer, pl_module) -> None:
        if self.stopped is not None:
            return
        directory = self._directory(trainer)
        verdict = decide(directory, estimate(directory, ("*.ckpt",), pl_module, *trainer.optimizers), self.reserve)
        if verdict.action == GO:
            return
        trainer.should_stop = True
        if verdict.action == STOP:
            for callback in trainer.checkpoint_callbacks:
                if hasattr(callback, "_last_global_step_saved"):  # ModelCheckpoint's "already saved at this step"
                    callback._last_global_step_saved = trainer.global_step
        self.stopped = verdict
        if trainer.is_global_zero:
            report_stop(verdict, directory, "lightning", self.state_dir)


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file, fsync, rename: a full disk leaves the old checkpoints and
    no torn file (the save raises trainguard.guard.CheckpointWontFit instead)."""

    def __init__(self, *, state_dir: str | None = None):
        self.state_dir = state_dir

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # reserve=0: whether to save at all is DiskGuard's call; here only the write must be safe.
        save_checkpoint(lambda f: torch.save(checkpoint, f), path, reserve=0, state_dir=self.state_dir)
