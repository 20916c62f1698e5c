"""A real fill: a child process saves checkpoints onto a loop-mounted ext4 until one does not fit.

The daemon's parts watch it as they would a training disk: statvfs of the mount into History (stamped by
a fake clock, one sample per simulated 10 s), the newest checkpoint under the policy's root sampled into
the snapshot, and the next-checkpoint detector judged just before each save. It must warn before the
save that fails with ENOSPC, and not before the saves that have room.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from trainguard import config as configmod
from trainguard.detectors import DetectorInput, checkpoint
from trainguard.detectors.series import series_of
from trainguard.records import FsSample, Snapshot
from trainguard.sources.checkpoints import CheckpointSampler
from trainguard.sources.fs import usage_from_statvfs
from trainguard.store.history import History

from tests.support.clock import FakeClock
from tests.support.snapshots import mount

MiB = 2**20
CKPT = 6 * MiB
TICKS_PER_SAVE = 6  # a save every simulated minute, one sample every simulated 10 s

WRITER = textwrap.dedent("""
    import errno, os, sys
    root = sys.argv[1]
    for line in sys.stdin:
        step, nbytes = line.split()
        path = os.path.join(root, f"checkpoint-{step}.pt")
        try:
            with open(path, "wb") as fh:
                for _ in range(int(nbytes) // 65536):
                    fh.write(b"\\1" * 65536)
                fh.flush()
                os.fsync(fh.fileno())
            print("ok", step, flush=True)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            os.unlink(path)
            print("enospc", step, flush=True)
""")


@pytest.mark.parametrize("ext4_mount", [48 * MiB], indirect=True)
def test_the_next_checkpoint_finding_fires_before_the_save_that_fails(ext4_mount, tmp_path):
    root = ext4_mount / "run"
    root.mkdir()
    config = configmod.parse({
        "forecast": {"window": "1h", "min_span": "5m"},
        "cleanup": [{"name": "ckpt", "type": "checkpoints", "roots": [str(root)], "keep_last": 100}],
    }, "test")
    clock = FakeClock()
    history = History(None, window=config.forecast.window)
    sampler = CheckpointSampler(config.cleanup, every=0.0)
    m = mount(str(ext4_mount), fstype="ext4")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    before_save = []  # (avail before the save, findings just before it, the save's outcome)
    try:
        for save in range(1, 40):
            for _ in range(TICKS_PER_SAVE):
                clock.advance(10)
                sample = FsSample(m, clock.time(), usage_from_statvfs(os.statvfs(ext4_mount)))
                snap = Snapshot(ts=clock.time(), filesystems=(sample,),
                                checkpoints=sampler.sample(clock.time(), (sample,)))
                history.record(clock.time(), series_of(snap))
            findings = checkpoint.detect(DetectorInput(config, history, snap, clock.time()))
            writer.stdin.write(f"{save} {CKPT}\n")
            writer.stdin.flush()
            outcome = writer.stdout.readline().split()[0]
            before_save.append((sample.usage.avail_bytes, findings, outcome))
            if outcome == "enospc":
                break
    finally:
        writer.stdin.close()
        writer.wait(10)
    outcomes = [o for _, _, o in before_save]
    assert outcomes[-1] == "enospc" and outcomes.count("ok") >= 4, outcomes
    avail, findings, _ = before_save[-1]
    (f,) = findings  # warned before the save that failed
    assert f.key == f"fs.next_checkpoint:{ext4_mount}"
    assert f.details["checkpoint_bytes"] >= CKPT * 0.95 and avail < f.details["needed_bytes"]
    assert f.details["roots"] == [str(root)]
    assert f.details["next_write_in_seconds"] is not None and f.details["next_write_in_seconds"] <= 60
    for avail, findings, outcome in before_save[:-1]:
        if avail >= 1.2 * CKPT:
            assert findings == [], (avail, findings)  # room for the next one: silent
