"""A daily cleanup rhythm survives a restart: the daemon's state database keeps the cycles it learned.

A real tmpfs fills for a day and is cleaned each day at the same hour, down to ~8 % free: without the
rhythm, the last hours before each cleanup read as "full in < 6 h". A daemon on a fake clock (a cycle every
5 minutes of it) learns the rhythm, is stopped mid-day and started again on the same state directory; the
new one raises no forecast alert through the next cleanup and the day after it.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from trainguard import config as configmod
from trainguard.records import AlertEvent
from trainguard.service.daemon import Daemon
from trainguard.store.cycles import read
from trainguard.store.state import read_only

from tests.support.clock import FakeClock
from tests.support.fake_daemon import Recorder
from tests.support.mounts import root_reason

pytestmark = pytest.mark.root

MiB = 2**20
H = 3600.0
DAY = 24 * H
STEP = 300.0  # fake seconds per cycle
SIZE = 64 * MiB
HIGH, LOW = 0.90, 0.08  # free share just after and just before each cleanup
PER_CYCLE = int((HIGH - LOW) * SIZE * STEP / DAY)


class DailyRhythm:
    """Writes to the tmpfs at a steady pace; at each day's cleanup hour deletes what the day wrote."""

    def __init__(self, mountpoint, clock: FakeClock):
        self.mountpoint, self.clock, self.day, self.pieces = mountpoint, clock, None, 0
        ballast = int((1 - HIGH) * SIZE) - self.used()  # what stays: the disk is at HIGH free after a cleanup
        with open(os.path.join(mountpoint, "ballast"), "wb") as fh:
            fh.write(b"\0" * max(ballast, 0))

    def used(self) -> int:
        st = os.statvfs(self.mountpoint)
        return (st.f_blocks - st.f_bavail) * st.f_frsize

    def step(self) -> None:
        day = int(self.clock.time() // DAY)
        if self.day is not None and day != self.day:
            for k in range(self.pieces):
                os.unlink(os.path.join(self.mountpoint, f"day-{self.day}-{k}"))
            self.pieces = 0
        self.day = day
        with open(os.path.join(self.mountpoint, f"day-{day}-{self.pieces}"), "wb") as fh:
            fh.write(b"\1" * PER_CYCLE)
        self.pieces += 1


def start(tmp_path, mountpoint, clock: FakeClock, recorder: Recorder) -> Daemon:
    cfg = configmod.parse({"gpu": {"enabled": False}, "filesystems": {"exclude": ["*"], "paths": [str(mountpoint)]},
                           "alerts": {"keep_firing_for": "0s"}}, "test")
    return Daemon(configmod.Loaded(cfg, "test"), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[recorder])


def run(daemon: Daemon, disk: DailyRhythm, clock: FakeClock, until: float) -> None:
    while clock.time() < until:
        clock.advance(STEP)
        disk.step()
        daemon.cycle()


def forecast_events(recorder: Recorder) -> list[AlertEvent]:
    return [e for e in recorder.events if e.finding.key.startswith("fs.forecast:")]


@pytest.mark.parametrize("tmpfs_mount", [SIZE], indirect=True)
def test_a_daemon_restarted_mid_rhythm_raises_no_forecast_alert(tmp_path, tmpfs_mount):
    t0 = (time.time() // DAY + 10) * DAY  # midnight, wall-clock-like; each day's cleanup comes at midnight
    clock = FakeClock(wall=t0 + 0.5 * H)
    disk = DailyRhythm(tmpfs_mount, clock)
    first = Recorder()
    daemon = start(tmp_path, tmpfs_mount, clock, first)
    try:
        # Three days: a fill with no cleanup in sight, then one cleanup seen (either may be warned of: no
        # rhythm is known yet), then two: a rhythm that frees what each day writes.
        run(daemon, disk, clock, t0 + 2 * DAY + 18 * H)
        assert not forecast_events(first)[-1:] or forecast_events(first)[-1].status.value == "resolved"
        learned = daemon.fits[str(tmpfs_mount)].cycles
        assert len(learned) >= 2 and learned[-1].ts > t0 + 2 * DAY - STEP
    finally:
        daemon.close()
    conn = read_only(str(tmp_path / "state"))
    assert len(read(conn, clock.time())[str(tmpfs_mount)]) >= 2  # on disk, not only in the process
    conn.close()

    clock.advance(600)  # down for 10 minutes, 6 h before the disk would be full
    second = Recorder()
    daemon = start(tmp_path, tmpfs_mount, clock, second)
    try:
        run(daemon, disk, clock, t0 + 4 * DAY + 2 * H)  # through two more cleanups
        assert forecast_events(second) == [], [e.finding.summary for e in forecast_events(second)]
    finally:
        daemon.close()


def _attach_and_mount(image, mountpoint) -> str:
    device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                            text=True).stdout.strip()
    subprocess.run(["mount", "-t", "ext4", device, str(mountpoint)], check=True)
    return device


def _unmount_and_detach(mountpoint, device) -> None:
    subprocess.run(["umount", str(mountpoint)], check=False)
    subprocess.run(["losetup", "-d", device], check=False)


def test_another_disk_mounted_at_the_same_path_does_not_inherit_the_rhythm(tmp_path):
    """Two ext4 disks take turns at one mount point, in the same loop device slot where the kernel gives it
    again (the same device number: only the filesystem's UUID tells them apart). The rhythm learned on the
    first is not counted on for the second, whose lows it never saw: forgetting costs a warm-up, inheriting
    would postpone the warning of a fill."""
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    images = []
    for name in ("first.img", "second.img"):
        images.append(tmp_path / name)
        with open(images[-1], "wb") as fh:
            fh.truncate(SIZE + 16 * MiB)  # ext4's own metadata and journal take some
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(images[-1])], check=True)
    mountpoint = tmp_path / "data"
    mountpoint.mkdir()
    t0 = (time.time() // DAY + 10) * DAY
    clock = FakeClock(wall=t0 + 0.5 * H)
    device = _attach_and_mount(images[0], mountpoint)
    try:
        daemon = start(tmp_path, mountpoint, clock, Recorder())
        try:
            run(daemon, DailyRhythm(mountpoint, clock), clock, t0 + 2 * DAY + 18 * H)
            assert len(daemon.fits[str(mountpoint)].cycles) >= 2
        finally:
            daemon.close()
        _unmount_and_detach(mountpoint, device)
        device = _attach_and_mount(images[1], mountpoint)  # often the same loop device, so the same number
        clock.advance(600)
        daemon = start(tmp_path, mountpoint, clock, Recorder())
        try:
            daemon.cycle()
            assert daemon.fits[str(mountpoint)].cycles == (), "the second disk inherited the first one's rhythm"
        finally:
            daemon.close()
        conn = read_only(str(tmp_path / "state"))
        assert read(conn, clock.time()).get(str(mountpoint), ()) == ()  # nor does the state db keep it
        conn.close()
    finally:
        _unmount_and_detach(mountpoint, device)
