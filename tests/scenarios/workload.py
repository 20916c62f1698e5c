"""The scaled-down field workloads, shared by the scenario tests and ``bench/report``.

Scenario A is the "No space left on device at hour 30" report compressed into
seconds: a 64 MiB ext4 disk (about 53 MiB usable), a 4 MiB checkpoint every
second and a few scratch files. Left alone it fills the disk at epoch 13 of
15; with a keep-last-3 checkpoint policy on a 75 % watermark one cleanup is
enough for the run to finish (and the disk ends below the watermark, so a
longer wait cannot trigger a second one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.scenarios.harness import TRAINER


@dataclass(frozen=True, slots=True)
class DiskFillWorkload:
    fs_bytes: int = 64 * 2**20
    epochs: int = 15
    ckpt_bytes: int = 4 * 2**20
    tmp_bytes: int = 128 * 2**10
    epoch_seconds: float = 1.0

    @property
    def written_bytes(self) -> int:
        """What the run writes in checkpoints and scratch files (logs come on top)."""
        return self.epochs * (self.ckpt_bytes + self.tmp_bytes)

    def dirs(self, mountpoint: Path) -> dict[str, Path]:
        run = mountpoint / "runs" / "resnet50"
        return {"ckpt": run / "checkpoints", "logs": run / "logs", "tmp": mountpoint / "tmp"}

    def trainer_args(self, mountpoint: Path, manifest: Path) -> list[str]:
        d = self.dirs(mountpoint)
        return [str(TRAINER), "--ckpt-dir", str(d["ckpt"]), "--log-dir", str(d["logs"]), "--tmp-dir", str(d["tmp"]),
                "--manifest", str(manifest), "--epochs", str(self.epochs), "--ckpt-size", str(self.ckpt_bytes),
                "--tmp-size", str(self.tmp_bytes), "--epoch-seconds", str(self.epoch_seconds)]


def read_manifest(path: Path) -> list[dict]:
    """The trainer's record of every checkpoint it saved, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The daemon's timing for scenario A, scaled like the workload (1 s of test ~ 1 h of the field run).
A_INTERVAL_S = 1.0
A_KEEP_FIRING_S = 5.0  # a cleanup moves the trend for a few seconds; the warning must not flap with it


def webhook_config(webhook_url: str) -> str:
    """A JSON webhook target on the test's receiver, sending at once and retrying fast."""
    return f"""
[notify]
group_interval = "0s"
retry_initial = "1s"
retry_max = "2s"

[[notify.targets]]
name = "webhook"
url = "{webhook_url.replace("http://", "json://", 1)}/hook"
"""


def disk_fill_config(mountpoint: Path, webhook_url: str | None, *, cleanup: bool = True,
                     min_span: float = 5.0, keep_firing_for: float = A_KEEP_FIRING_S) -> str:
    """trainguard config for scenario A: watch only the test disk, forecast on a 60 s window,
    keep the last 3 checkpoints once the disk is 75 % full, send alerts to a JSON webhook."""
    runs = mountpoint / "runs"
    text = f"""
[general]
interval = "{A_INTERVAL_S:g}s"

[filesystems]
paths = ["{mountpoint}"]
exclude = ["*"]            # only the test disk: other mounts on a CI host are not this test's business
warning = "90%"
critical = "95%"

[forecast]
window = "60s"
min_span = "{min_span:g}s"
warning = "60s"            # the field report's "warn 6 h ahead", scaled
critical = "2s"
min_samples = 5            # the whole scaled run is 15 samples
evidence_ratio = 3         # and its 60 s window is four runs long: the field's 6 h window scaled, not the run

[alerts]
keep_firing_for = "{keep_firing_for:g}s"

[gpu]
enabled = false

[metrics]
listen = ""
"""
    if webhook_url is not None:
        text += webhook_config(webhook_url)
    if cleanup:
        text += f"""
[[cleanup]]
name = "checkpoints"
type = "checkpoints"
roots = ["{runs}"]
patterns = ["*.pth"]
keep_last = 3
watermark = true
high = "75%"
low = "20%"
grace = "1s"
"""
    return text
