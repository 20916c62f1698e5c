"""Every number the daemon writes to history each cycle is read back by something.

A series nobody reads costs every cycle an in-memory point and a row in the state database (half of
the cycle's history work once, with 30 mounts and 8 GPUs); what is only worth watching over time
belongs on /metrics."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from tests.support.snapshots import disk, fs_sample, snapshot
from trainguard.detectors.series import series_of
from trainguard.records import GpuSample, XidEvent

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "daemon" / "trainguard"


def full_snapshot():
    gpu = GpuSample(index=0, uuid="GPU-0", name="H200", ts=0.0, util_ratio=0.0, util_max_ratio=0.0,
                    memory_used_bytes=1, memory_total_bytes=2, temperature_c=60.0, power_w=300.0,
                    power_limit_w=700.0, throttle_reasons=4, xid_events=(XidEvent(0, 79, 0.0),))
    return dataclasses.replace(snapshot(fs_sample("/data", 0.5), disks=(disk("md0"),)), gpus=(gpu,))


def readers(prefix: str) -> list[str]:
    """Modules other than the writer that read `prefix` back (points/latest, or SQL on the name)."""
    pattern = re.compile(re.escape(prefix) + r"[:%]")
    return [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if p.name != "series.py" and pattern.search(p.read_text())]


def test_every_recorded_series_has_a_reader():
    prefixes = sorted({name.split(":", 1)[0] for name in series_of(full_snapshot())})
    assert {"fs.avail_bytes", "disk.util", "gpu.util", "gpu.xid"} <= set(prefixes)
    unread = [p for p in prefixes if not readers(p)]
    assert unread == [], f"written to history every cycle, read by nothing: {unread}"
