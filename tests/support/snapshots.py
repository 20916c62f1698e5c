"""Builders for the records detectors read, so detector tests state only what matters to them."""

from __future__ import annotations

from trainguard.records import DiskIo, FsSample, FsUsage, Mount, MountKind, Snapshot

GiB = 2**30


def mount(mp: str = "/data", fstype: str = "xfs", dev: tuple[int, int] = (9, 0),
          kind: MountKind = MountKind.LOCAL) -> Mount:
    return Mount(mount_point=mp, fstype=fstype, source=f"/dev/{fstype}{dev[1]}", major=dev[0], minor=dev[1],
                 kind=kind)


def usage(used_ratio: float = 0.5, size: int = 100 * GiB, *, avail: int | None = None,
          inodes_used_ratio: float | None = 0.1, inodes_total: int = 1_000_000) -> FsUsage:
    """A usage with no reserved blocks: used + avail == size."""
    if avail is None:
        avail = round(size * (1 - used_ratio))
    if inodes_used_ratio is None:
        inodes_total, inodes_used = 0, 0
    else:
        inodes_used = round(inodes_total * inodes_used_ratio)
    return FsUsage(size_bytes=size, used_bytes=size - avail, avail_bytes=avail, inodes_total=inodes_total,
                   inodes_used=inodes_used, inodes_free=inodes_total - inodes_used)


def fs_sample(mp: str = "/data", used_ratio: float = 0.5, *, ts: float = 0.0, m: Mount | None = None,
              **usage_kw) -> FsSample:
    return FsSample(m or mount(mp), ts, usage(used_ratio, **usage_kw))


def disk(name: str = "md0", dev: tuple[int, int] = (9, 0), util: float = 0.5) -> DiskIo:
    return DiskIo(name=name, major=dev[0], minor=dev[1], util_ratio=util, read_bytes_per_s=1e6,
                  write_bytes_per_s=200e6, await_ms=12.5)


def snapshot(*filesystems: FsSample, ts: float = 0.0, disks=(), missing=()) -> Snapshot:
    return Snapshot(ts=ts, filesystems=tuple(filesystems), disks=tuple(disks), missing_paths=tuple(missing))
