"""fs.next_checkpoint: the next checkpoint will not fit. Learned from the steps in free space (size and
period) and from the newest checkpoint under a checkpoints policy's roots, judged before the write."""

from __future__ import annotations

import os

import pytest
from trainguard import config as configmod
from trainguard.detectors import DetectorInput, checkpoint
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import CheckpointFact, FsSample, FsUsage, Severity
from trainguard.store.history import History

from tests.support import traces
from tests.support.snapshots import GiB, mount, snapshot

H = 3600.0
T0 = 1_700_000_000.0
EVERY, CKPT = 1800.0, 20 * GiB


def detect_at(process, now, config=None, facts=(), history_from=None):
    config = config or configmod.parse({}, "test")
    h = History(None, window=config.forecast.window)
    start = max(0.0, now - config.forecast.window) if history_from is None else history_from
    for ts, value in process.sample(start, now):
        h.record(T0 + ts, {"fs.avail_bytes:/data": value})
    avail = int(process.avail(now))
    usage = FsUsage(size_bytes=int(process.size), used_bytes=int(process.size) - avail, avail_bytes=avail,
                    inodes_total=0, inodes_used=0, inodes_free=0)
    snap = snapshot(FsSample(mount("/data"), T0 + now, usage), ts=T0 + now)
    snap = snap.__class__(**{**{f: getattr(snap, f) for f in snap.__slots__}, "checkpoints": tuple(facts)})
    return checkpoint.detect(DetectorInput(config, h, snap, T0 + now))


def test_warns_before_the_write_that_would_not_fit_and_not_while_there_is_room():
    """20 GiB every 30 min onto a disk with 130 GiB free: the writes at 0.5 h .. 3 h fit, the seventh
    (at 3.5 h, 10 GiB free) does not. Evaluated every 5 minutes, the finding appears only in the period
    before that write, names its time, and is critical in the last half hour."""
    process = traces.checkpoints(every_s=EVERY, size=CKPT, start_free=130 * GiB, noise=0.1 * GiB)
    fired = {}
    for k in range(1, 42):
        now = 300.0 * k
        fired[now] = detect_at(process, now)
    failing_write = 6 * EVERY  # the 7th write (t = 3 h) starts with 10 GiB free
    for now, findings in fired.items():
        free_at_next = process.avail(now) if now % EVERY else process.avail(now - 1)
        if now < failing_write - EVERY:
            assert findings == [], (now, findings)
        elif failing_write - EVERY + 300 <= now < failing_write:
            (f,) = findings
            assert f.key == "fs.next_checkpoint:/data"
            assert f.details["next_write_ts"] == pytest.approx(T0 + failing_write, abs=60)
            assert f.details["checkpoint_bytes"] == pytest.approx(CKPT, rel=0.05)
            assert f.severity is Severity.CRITICAL  # within checkpoint_critical (30 min) of the write
            assert "will not fit" in f.summary and free_at_next < CKPT
            assert "放不下下一个 checkpoint" in texts_for(f, tr("zh")).fact  # the facts its renderer reads


def test_no_finding_while_the_next_checkpoint_fits_with_its_margin():
    process = traces.checkpoints(every_s=EVERY, size=CKPT, start_free=400 * GiB, noise=0.2 * GiB)
    for k in range(6, 48):  # 8 h: 340 GiB written, 60 GiB free at the end
        assert detect_at(process, 600.0 * k) == [], k


def test_warning_when_the_write_is_further_off_than_the_critical_window():
    config = configmod.parse({"forecast": {"checkpoint_critical": "10m"}}, "test")
    process = traces.checkpoints(every_s=2 * H, size=CKPT, start_free=80 * GiB + 5 * GiB, noise=0.05 * GiB)
    # Steps at 0, 2, 4 h (60 GiB); 25 GiB free after the one at 4 h; the next at 6 h needs 22 GiB: fits.
    assert detect_at(process, 4.5 * H, config) == []
    process = traces.checkpoints(every_s=2 * H, size=CKPT, start_free=75 * GiB, noise=0.05 * GiB)
    (f,) = detect_at(process, 4.5 * H, config)  # 15 GiB free, next at 6 h: 1.5 h away
    assert f.severity is Severity.WARNING
    assert f.details["next_write_in_seconds"] == pytest.approx(1.5 * H, abs=120)


def test_a_rhythm_that_stopped_is_not_judged():
    def avail(t):
        written = min(t // EVERY + 1, 4) * CKPT  # four checkpoints, then the run ended
        return 90 * GiB - written

    process = traces.Process("stopped", avail, noise=0.05 * GiB)
    assert detect_at(process, 3 * EVERY + 600)  # still on its rhythm: 10 GiB free, 20 GiB due
    assert detect_at(process, 3 * EVERY + 3.5 * EVERY) == []


def test_a_policy_roots_newest_checkpoint_sets_the_size():
    # No steps in the history (a flat disk), but the newest checkpoint under the policy's root is 30 GiB.
    process = traces.Process("flat", lambda t: 25 * GiB, noise=0.05 * GiB)
    big = CheckpointFact("/data/runs", "/data", 30 * GiB, T0, "/data/runs/a/checkpoint-900")
    (f,) = detect_at(process, 2 * H, facts=[big])
    assert f.severity is Severity.WARNING and f.details["next_write_ts"] is None
    assert f.details["roots"] == ["/data/runs"] and f.details["checkpoint_bytes"] == 30 * GiB
    small = CheckpointFact("/data/runs", "/data", 10 * GiB, T0)
    assert detect_at(process, 2 * H, facts=[small]) == []
    other = CheckpointFact("/scratch/runs", "/scratch", 30 * GiB, T0)
    assert detect_at(process, 2 * H, facts=[other]) == []


def test_a_keep_last_trainer_with_room_is_left_alone():
    process = traces.keep_last_checkpoints()
    for k in range(20):
        assert detect_at(process, 7 * H + 613 * k) == []


def test_disabled():
    process = traces.checkpoints(every_s=EVERY, size=CKPT, start_free=130 * GiB, noise=0.1 * GiB)
    config = configmod.parse({"forecast": {"next_checkpoint": False}}, "test")
    assert detect_at(process, 5.5 * EVERY, config) == []
    assert detect_at(process, 5.5 * EVERY)


def test_the_sampler_reports_the_newest_checkpoint_under_each_root(tmp_path):
    from trainguard.sources.checkpoints import CheckpointSampler

    run = tmp_path / "runs" / "llama"
    for step, nbytes, mtime in (("checkpoint-100", 3000, 1000), ("checkpoint-200", 5000, 2000)):
        d = run / step
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * nbytes)
        (d / "optimizer.pt").write_bytes(b"y" * 100)
        os.utime(d, (mtime, mtime))
    (run / "old.pt").write_bytes(b"z" * 9000)
    os.utime(run / "old.pt", (500, 500))
    config = configmod.parse({"cleanup": [{"name": "c", "type": "checkpoints", "roots": [str(tmp_path / "runs")]}]},
                             "test")
    here = FsSample(mount("/"), T0, None)
    (fact,) = CheckpointSampler(config.cleanup).sample(T0, (here,))
    assert (fact.mount_point, fact.newest_bytes, fact.newest_mtime) == ("/", 5100, 2000)
    assert fact.newest_path.endswith("checkpoint-200")
    hung = FsSample(mount("/"), T0, None, responsive=False, unresponsive_since=T0)
    assert CheckpointSampler(config.cleanup).sample(T0, (hung,)) == ()  # never read a mount that hangs


@pytest.mark.parametrize("seed", [2, 4])
def test_between_a_save_and_its_rotation_nothing_is_raised(seed):
    """A GC at 97 % runs just after the save that crosses it: for those two minutes free space is below
    one checkpoint, but a cleanup has come at that level every cycle, so the next save will have room."""
    process = traces.gc_churn(0.85, 0.97, seed)
    tight = [t for t in (6 * H + 30.0 * k for k in range(int(42 * H / 30))) if process.avail(t) < 4.4 * GiB]
    moments = [t for k, t in enumerate(tight) if k == 0 or t - tight[k - 1] > 600]  # one per cycle
    assert len(moments) >= 3
    for now in moments:
        assert detect_at(process, now) == [], now
