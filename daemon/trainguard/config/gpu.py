"""[gpu]: the stall rule, its per-GPU overrides and the GPU health alerts."""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from pydantic import Field

from trainguard.config.base import Strict
from trainguard.config.types import Duration, PositiveDuration, Ratio


class GpuOverride(Strict):
    """Per-GPU stall thresholds, matched by index ("0"), UUID or name glob ("*A100*")."""

    match: str
    vram_ratio: Ratio | None = None
    util_floor: Ratio | None = None
    for_: Duration | None = Field(None, alias="for")
    ignore: bool = False


class GpuRule(Strict):
    vram_ratio: Ratio
    util_floor: Ratio
    for_: Duration = Field(alias="for")
    ignore: bool = False


# Throttle reasons that mean the GPU is slowed by heat or power delivery, not by normal load
# (SW power capping is routine at full load and is left out by default).
ThrottleReason = Literal["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]


class Gpu(Strict):
    enabled: bool = True
    interval: PositiveDuration | None = None  # None: general.interval
    # Stall: VRAM used >= vram_ratio and utilisation <= util_floor, averaged over `for`,
    # on a GPU that has a compute process.
    vram_ratio: Ratio = 0.8
    util_floor: Ratio = 0.05
    for_: Duration = Field(300.0, alias="for")
    overrides: list[GpuOverride] = []
    orphan_for: Duration = 60.0  # memory held by a dead/zombie process this long -> alert
    xid_hold: Duration = 3600.0  # an XID alert stays up this long after the last event
    throttle_for: Duration = 600.0
    throttle_reasons: list[ThrottleReason] = [
        "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake",
    ]
    # NVML reports host PIDs. "auto": trust them when our /proc is the host PID namespace.
    host_pid_namespace: Literal["auto", "yes", "no"] = "auto"
    py_spy: bool = True  # name Python threads with `py-spy dump` when it is installed
    # What trainguard does about a stall besides alerting: "none", or "notify-owner": the alert also goes to
    # the owner routes ([[notify.targets]] with `owners`) of the stalled processes. Never a signal to them.
    act: Literal["none", "notify-owner"] = "none"

    def rule_for(self, index: int, uuid: str = "", name: str = "") -> GpuRule:
        values: dict[str, Any] = {"vram_ratio": self.vram_ratio, "util_floor": self.util_floor,
                                  "for": self.for_, "ignore": False}
        for override in self.overrides:
            if override.match == str(index) or override.match == uuid or (
                name and fnmatch.fnmatchcase(name, override.match)
            ):
                values.update(override.model_dump(exclude={"match"}, exclude_none=True, by_alias=True))
        return GpuRule.model_validate(values)
