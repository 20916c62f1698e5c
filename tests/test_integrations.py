"""The transformers and Lightning callbacks stop a real (tiny, CPU) training run on a small tmpfs that fills.

Each run saves a checkpoint every step, so the disk fills within a few steps: without the guard the
run dies of ENOSPC mid-save; with it, the run saves and stops cleanly, and its last checkpoint is whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from trainguard import guardspool

from tests.support import NOT_INSTALLED
from tests.support.mounts import fill

torch = pytest.importorskip("torch", reason=f"torch {NOT_INSTALLED}")
pytestmark = pytest.mark.root
MiB = 2**20
STEPS = 40


class Tiny(torch.nn.Module):
    """About 260 KiB of parameters: a checkpoint with Adam's state is under 1 MiB."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)

    def forward(self, x, labels=None):
        out = self.layer(x)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


def rows(n: int = STEPS * 2):
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(256, generator=g), "labels": torch.randn(256, generator=g)} for _ in range(n)]


def state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.db").touch()
    return state


def spooled(state: Path) -> list[guardspool.GuardEvent]:
    return guardspool.drain(str(state / guardspool.GUARD_EVENTS_FILE))[0]


# ------------------------------------------------------------------ transformers


def hf_trainer(output_dir: Path, callbacks):
    transformers = pytest.importorskip("transformers", reason=f"transformers {NOT_INSTALLED}")
    args = transformers.TrainingArguments(
        output_dir=str(output_dir), max_steps=STEPS, save_steps=1, per_device_train_batch_size=2,
        logging_steps=1000, report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return transformers.Trainer(model=Tiny(), args=args, train_dataset=rows(), callbacks=callbacks)


@pytest.mark.parametrize("tmpfs_mount", [5 * MiB], indirect=True)
def test_transformers_run_saves_then_stops_before_the_disk_is_full(tmpfs_mount, tmp_path):
    from trainguard.integrations.transformers import DiskGuardCallback

    state = state_dir(tmp_path)
    guard = DiskGuardCallback(reserve="256KiB", state_dir=str(state))
    trainer = hf_trainer(tmpfs_mount / "run", [guard])
    trainer.train()  # returns: no ENOSPC, no exception
    assert guard.stopped is not None and 0 < trainer.state.global_step < STEPS
    checkpoints = sorted((tmpfs_mount / "run").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    last = checkpoints[-1]
    assert last.name == f"checkpoint-{trainer.state.global_step}"  # the stop came right after a save
    assert json.loads((last / "trainer_state.json").read_text())["global_step"] == trainer.state.global_step
    from safetensors.torch import load_file

    assert set(load_file(str(last / "model.safetensors"))) == {"layer.weight", "layer.bias"}
    torch.load(last / "optimizer.pt", weights_only=True)  # whole, loadable
    stopped = [e for e in spooled(state) if e.kind == "stopped"]
    assert len(stopped) == 1 and stopped[0].source == "transformers"


@pytest.mark.parametrize("tmpfs_mount", [5 * MiB], indirect=True)
def test_transformers_run_without_the_guard_dies_mid_save(tmpfs_mount):
    trainer = hf_trainer(tmpfs_mount / "run", [])
    with pytest.raises(Exception) as err:  # the disk-full error surfaces as the library wraps it
        trainer.train()
    assert "No space left on device" in str(err.value) or "write failed" in str(err.value)
    checkpoints = sorted((tmpfs_mount / "run").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert not (checkpoints[-1] / "trainer_state.json").exists()  # the torn checkpoint it leaves


@pytest.mark.parametrize("tmpfs_mount", [5 * MiB], indirect=True)
def test_transformers_guard_skips_a_save_that_would_not_fit(tmpfs_mount, tmp_path):
    from trainguard.integrations.transformers import DiskGuardCallback

    guard = DiskGuardCallback(reserve=0, state_dir=str(state_dir(tmp_path)))
    fill(tmpfs_mount / "someone-else.bin", 4 * MiB + 768 * 1024)  # less room than one checkpoint
    trainer = hf_trainer(tmpfs_mount / "run", [guard])
    trainer.train()
    assert trainer.state.global_step == 1 and guard.stopped.action == "stop"
    assert not list((tmpfs_mount / "run").glob("checkpoint-*"))


# ------------------------------------------------------------------ lightning


def lightning_run(dirpath: Path, callbacks, plugins=()):
    pl = pytest.importorskip("lightning.pytorch", reason=f"lightning {NOT_INSTALLED}")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Tiny()

        def training_step(self, batch, _idx):
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(dirpath), every_n_train_steps=1, save_top_k=-1)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[*callbacks, checkpoint], plugins=list(plugins),
                         default_root_dir=str(dirpath.parent))
    loader = torch.utils.data.DataLoader(rows(), batch_size=2)
    module = Module()
    trainer.fit(module, loader)
    return trainer


@pytest.mark.parametrize("tmpfs_mount", [5 * MiB], indirect=True)
def test_lightning_run_saves_then_stops_before_the_disk_is_full(tmpfs_mount, tmp_path):
    from trainguard.integrations.lightning import AtomicCheckpointIO, DiskGuard

    state = state_dir(tmp_path)
    guard = DiskGuard(reserve="256KiB", state_dir=str(state))
    trainer = lightning_run(tmpfs_mount / "ckpt", [guard], [AtomicCheckpointIO(state_dir=str(state))])
    assert guard.stopped is not None and 0 < trainer.global_step < STEPS
    saved = sorted(os.listdir(tmpfs_mount / "ckpt"))
    assert all(not name.startswith(".") for name in saved)  # no temporaries left behind
    assert f"epoch=0-step={trainer.global_step}.ckpt" in saved  # saved at the step it stopped
    ckpt = torch.load(tmpfs_mount / "ckpt" / f"epoch=0-step={trainer.global_step}.ckpt", weights_only=False)
    assert ckpt["global_step"] == trainer.global_step and ckpt["optimizer_states"]
    kinds = [e.kind for e in spooled(state)]
    assert kinds.count("stopped") == 1 and kinds.count("saved") == len(saved)


@pytest.mark.parametrize("tmpfs_mount", [5 * MiB], indirect=True)
def test_lightning_guard_skips_a_save_that_would_not_fit(tmpfs_mount, tmp_path):
    from trainguard.integrations.lightning import DiskGuard

    guard = DiskGuard(reserve=0, state_dir=str(state_dir(tmp_path)))
    (tmpfs_mount / "ckpt").mkdir()
    fill(tmpfs_mount / "someone-else.bin", 4 * MiB + 768 * 1024)
    trainer = lightning_run(tmpfs_mount / "ckpt", [guard])
    assert trainer.global_step == 1 and guard.stopped.action == "stop"
    assert os.listdir(tmpfs_mount / "ckpt") == []


def test_transformers_rotation_estimate_matches_what_save_total_limit_deletes(tmp_path):
    pytest.importorskip("transformers", reason=f"transformers {NOT_INSTALLED}")
    from trainguard.integrations.transformers import rotation_frees
    from transformers.trainer_utils import rotate_checkpoints

    for step, size in ((10, 1000), (20, 2000), (30, 4000), (40, 8000)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"m" * size)
    best = str(tmp_path / "checkpoint-10")
    frees = rotation_frees(str(tmp_path), 2, best)  # before checkpoint-50: what will go after it
    (tmp_path / "checkpoint-50").mkdir()
    before = {p.name for p in tmp_path.iterdir()}
    rotate_checkpoints(str(tmp_path), save_total_limit=2, best_model_checkpoint=best)
    gone = before - {p.name for p in tmp_path.iterdir()}
    assert gone == {"checkpoint-20", "checkpoint-30", "checkpoint-40"} and frees >= 14000


@pytest.mark.parametrize("tmpfs_mount", [2 * MiB], indirect=True)
def test_torch_save_on_a_full_disk_raises_wont_fit_and_leaves_nothing(tmpfs_mount):
    from trainguard.guard import CheckpointWontFit, save_checkpoint

    (tmpfs_mount / "model_1.pt").write_bytes(b"last good")
    state = {"w": torch.zeros(1024, 1024)}  # 4 MiB: more than the disk; the estimate (9 bytes) says it fits
    with pytest.raises(CheckpointWontFit) as err:
        save_checkpoint(state, tmpfs_mount / "model_2.pt", save_fn=torch.save, reserve=0)
    assert err.value.written > 0 and err.value.__cause__ is not None  # torch's own error, chained
    assert sorted(os.listdir(tmpfs_mount)) == ["model_1.pt"]
    assert (tmpfs_mount / "model_1.pt").read_bytes() == b"last good"


class SeedCheckpointManager:
    """The keep-last-N manager from the field report on ENOSPC, as written there: the oldest checkpoint
    goes first, then torch.save writes straight to the final name."""

    def __init__(self, save_dir, max_keep=1):
        self.save_dir, self.max_keep, self.checkpoints = save_dir, max_keep, []

    def save(self, state, epoch, meanwhile):
        path = f"{self.save_dir}/model_{epoch}.pth"
        if len(self.checkpoints) >= self.max_keep:
            os.remove(self.checkpoints.pop(0))
        meanwhile()  # other writers take the space freed while the save runs
        torch.save(state, path)
        self.checkpoints.append(path)


def loadable(directory: Path) -> list[str]:
    good = []
    for name in sorted(os.listdir(directory)):
        try:
            torch.load(directory / name, weights_only=True)
            good.append(name)
        except Exception:
            pass
    return good


@pytest.mark.parametrize("tmpfs_mount", [12 * MiB], indirect=True)
def test_where_the_field_reports_manager_loses_every_checkpoint_the_guard_keeps_the_last(tmpfs_mount):
    from trainguard.guard import CheckpointWontFit, save_checkpoint

    state = {"w": torch.randn(768, 1024)}  # 3 MiB
    results = {}
    for how in ("seed", "guard"):
        run = tmpfs_mount / how
        run.mkdir()
        manager = SeedCheckpointManager(run)
        def grow(how=how):  # logs and caches grow while each save runs
            fill(tmpfs_mount / f"{how}.growing", 2 * MiB)

        def save_fn(obj, f):
            grow()
            torch.save(obj, f)

        try:
            for epoch in range(10):
                if how == "seed":
                    manager.save(state, epoch, grow)
                else:
                    save_checkpoint(state, run / f"model_{epoch}.pth", save_fn=save_fn, keep_last=1, reserve=0)
        except (CheckpointWontFit, RuntimeError, OSError) as exc:
            results[how] = (epoch, type(exc).__name__, loadable(run), sorted(os.listdir(run)))
        (tmpfs_mount / f"{how}.growing").unlink()
        for name in os.listdir(run):
            os.unlink(run / name)
    _epoch, _error, seed_good, seed_files = results["seed"]
    guard_epoch, guard_error, guard_good, guard_files = results["guard"]
    assert seed_good == [] and seed_files  # the old one deleted first, the new one torn: nothing to resume
    assert guard_error == "CheckpointWontFit" and guard_good == guard_files == [f"model_{guard_epoch - 1}.pth"]
