"""The plain-loop example in docs/guard.md runs as written, on a real filesystem that fills."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support import NOT_INSTALLED
from tests.support.mounts import fill, tmpfs

torch = pytest.importorskip("torch", reason=f"torch {NOT_INSTALLED}")
DOC = Path(__file__).resolve().parents[1] / "docs" / "guard.md"
MiB = 2**20


def example() -> str:
    text = DOC.read_text()
    section = text[text.index("### A plain training loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [24 * MiB], indirect=True)
def test_plain_loop_example_saves_spills_and_stops_cleanly(tmpfs_mount, capsys):
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights; with Adam's state a checkpoint is about 3 MiB
    optimizer = torch.optim.Adam(model.parameters())

    def train_one_epoch(model, optimizer):
        model(torch.randn(4, 512)).sum().backward()
        optimizer.step()
        fill(tmpfs_mount / "dataset.cache", 2 * MiB)  # something else on the disk keeps growing

    run_dir, spill_dir = tmpfs_mount / "run", tmpfs_mount / "spill"
    run_dir.mkdir()
    with tmpfs(8 * MiB) as spill_mount:  # the fallback directory is a second, smaller disk
        spill_dir = spill_mount
        namespace = {"epochs": 20, "model": model, "optimizer": optimizer, "train_one_epoch": train_one_epoch,
                     "run_dir": str(run_dir), "spill_dir": str(spill_dir)}
        exec(example().replace('"5GiB"', '"1MiB"'), namespace)
        kept = sorted(os.listdir(run_dir), key=lambda n: int(n[6:-3]))
        spilled = sorted(os.listdir(spill_dir))
        assert 1 <= len(kept) <= 3 and spilled  # keep_last held three at most; then the fallback took saves
        assert not [n for n in kept + spilled if n.startswith(".")]  # no temporary left anywhere
        out = capsys.readouterr().out
        assert "will not fit" in out and "nor in the fallback directory" in out
        last = torch.load(run_dir / kept[-1], weights_only=True)
        assert set(last) == {"epoch", "model", "optimizer"}
