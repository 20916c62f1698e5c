"""Scenario C, a bad day: scenario A while everything else goes wrong too.

- The webhook receiver is down for the first half of the run: the forecast
  warning waits in the outbox and arrives later, once.
- A broken config is installed and SIGHUP sent mid-run: the reload is refused
  with a message naming the key, and the running config keeps working.
- The daemon is SIGKILLed mid-run (warning still undelivered) and restarted on
  the same state directory: history, alert states and outbox survive, nothing is
  sent twice, and the forecast picks up where it was. The forecast needs 8 s of
  data (``min_span``) while a vanished finding resolves after 2 s
  (``keep_firing_for``): a restart that lost the history would resolve and
  re-fire the warning, which the exactly-once checks catch.

The run still finishes with its newest checkpoints intact.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import time
from pathlib import Path

import pytest

from tests.scenarios import webhook
from tests.scenarios.harness import (
    Processes,
    pending_messages,
    recorded_points,
    wait_until,
)
from tests.scenarios.runs import settle_cycles, sha256_of
from tests.scenarios.workload import DiskFillWorkload, disk_fill_config, read_manifest

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180)]


WORKLOAD = DiskFillWorkload(epoch_seconds=2.0)  # slower, so the bad things fit in before the cleanup
MIN_SPAN_S = 8.0
KEEP_FIRING_S = 2.0
FORECAST_LINE = r"FIRING \[warning\] .* \(fs\.forecast:"


@pytest.mark.parametrize("ext4_mount", [WORKLOAD.fs_bytes], indirect=True)
def test_bad_day(ext4_mount, tmp_path, http_receiver):
    manifest = tmp_path / "manifest.jsonl"
    avail_series = f"fs.avail_bytes:{ext4_mount}"
    good_config = disk_fill_config(ext4_mount, http_receiver.url, min_span=MIN_SPAN_S, keep_firing_for=KEEP_FIRING_S)
    http_receiver.stop()  # down from the start; it comes back on the same port
    with Processes(tmp_path / "procs") as procs:
        first = procs.trainguard(good_config, name="trainguard")
        wait_until(lambda: len(recorded_points(first.state_dir, avail_series)) >= 2, 30,
                   "trainguard watching the disk", abort=first.died)
        trainer = procs.python(*WORKLOAD.trainer_args(ext4_mount, manifest), name="trainer")

        # The warning fires while nobody can receive it: it waits in the outbox.
        first.wait_log(FORECAST_LINE, timeout=MIN_SPAN_S + 15)
        warned_at_wall = time.time()

        # A broken config and SIGHUP: refused, named, and the running config goes on.
        first.write_config(good_config.replace('interval = "1s"', 'interval = "every second"'))
        log_size = len(first.output())
        first.reload()
        rejected = first.wait_log(r"reload rejected, keeping the running config: .*general\.interval.*$",
                                  timeout=10, after=log_size)
        assert "every second" in rejected.group(0)
        reloaded_at_wall = time.time()
        wait_until(lambda: recorded_points(first.state_dir, avail_series)[-1][0] > reloaded_at_wall + 2, 10,
                   "cycles after the refused reload", abort=first.died)
        after_reload = [ts for ts, _ in recorded_points(first.state_dir, avail_series) if ts > reloaded_at_wall]
        assert max(b - a for a, b in zip(after_reload, after_reload[1:])) < 2.5, "cycles stalled after the reload"
        first.wait_log(r"target 'webhook': delivery failed", timeout=10, after=rejected.end())  # still retrying
        first.write_config(good_config)  # put right again, for the restart

        # SIGKILL mid-run, the warning still undelivered; restart on the same state directory.
        assert trainer.running()
        first.signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        points_before_kill = recorded_points(first.state_dir, avail_series)
        assert pending_messages(first.state_dir) >= 1, "the warning should be waiting in the outbox"
        second = procs.trainguard("", name="trainguard-restarted", state_dir=first.state_dir,
                                  config_path=first.config_path)
        second.wait_log(r"started", timeout=20)

        # Half-way through the run the receiver comes back.
        wait_until(lambda: len(read_manifest(manifest)) >= WORKLOAD.epochs // 2, 60, "half of the epochs",
                   abort=trainer.died)
        http_receiver.start()
        back_at = time.monotonic()
        warning = wait_until(lambda: webhook.find(webhook.received(http_receiver), "fs.forecast"), 15,
                             "the warning from before the crash", abort=second.died)[0]

        status = trainer.wait(timeout=WORKLOAD.epochs * WORKLOAD.epoch_seconds + 60)
        assert status == 0, trainer.output()[-3000:]
        wait_until(lambda: webhook.find(webhook.received(http_receiver), "fs.forecast", "resolved"), 60,
                   "the forecast alert resolving", abort=second.died)
        settle_cycles(second, avail_series)

    # The run survived the bad day.
    saved = read_manifest(manifest)
    assert [s["epoch"] for s in saved] == list(range(1, WORKLOAD.epochs + 1))
    for entry in saved[-3:]:
        path = Path(entry["path"])
        assert path.exists() and sha256_of(path) == entry["sha256"], f"{path} missing or corrupt"

    # The outbox survived the SIGKILL: the warning from before the crash arrived once the receiver was back.
    assert warning.arrived_at >= back_at
    assert dt.datetime.fromisoformat(warning.started_at).timestamp() <= warned_at_wall
    # History survived: the restarted daemon's database still has what the first one recorded.
    after = recorded_points(second.state_dir, avail_series)
    assert points_before_kill and set(points_before_kill) <= set(after)
    # Alert states survived and the forecast resumed at once: the restarted daemon did not fire the
    # warning again, and nothing was sent twice.
    assert not re.search(FORECAST_LINE, second.output()), second.output()
    alerts = webhook.received(http_receiver)
    assert webhook.duplicates(alerts) == [], webhook.describe(alerts)
    assert sorted((a.kind, a.status) for a in alerts) == sorted([
        ("fs.forecast", "firing"), ("cleanup.report", "firing"), ("fs.forecast", "resolved")]), (
        webhook.describe(alerts))
