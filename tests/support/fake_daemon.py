"""A Daemon on a fake clock with one fake mount, for end-to-end tests of the cycle without real time."""

from __future__ import annotations

import os

from trainguard import config as configmod
from trainguard.records import Mount, MountKind


class Recorder:
    def __init__(self):
        self.events = []

    def notify(self, events):
        self.events.extend(events)

    def close(self):
        pass


class FakeDisk:
    """One mount whose free space the test sets; statvfs answers from it."""

    def __init__(self, size=100 * 2**30):
        self.size = size
        self.avail = size

    def statvfs(self, _path):
        blocks = self.size // 4096
        free = self.avail // 4096
        return os.statvfs_result((4096, 4096, blocks, free, free, 1000, 900, 900, 0, 255))

    def read_mounts(self, _proc):
        return [Mount("/data", "xfs", "/dev/md0", 9, 0, MountKind.LOCAL)]


def daemon(tmp_path, clock, disk, recorder, sections=None):
    from trainguard.service.daemon import Daemon
    from trainguard.sources.diskstats import DiskstatsSampler
    from trainguard.sources.fs import FsSampler
    from trainguard.sources.samplers import Samplers

    cfg = configmod.parse(sections or {"forecast": {"window": "2h", "min_span": "20m"}}, "test")
    d = Daemon(configmod.Loaded(cfg, "test"), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[recorder])
    d.samplers = Samplers(
        fs=FsSampler(clock=clock, statvfs=disk.statvfs, read_mounts=disk.read_mounts, timeout=5, wait=1),
        disks=DiskstatsSampler(clock=clock, proc_root=str(tmp_path / "noproc")))
    return d
