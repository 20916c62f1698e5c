"""GPU sampling through NVML (nvidia-ml-py, import name pynvml).

The NVML module is a parameter: production passes the real pynvml, tests a fake with
scripted timelines. Calls go through sources.nvml.Query (absent fields, per-sample
errors); the errors that invalidate the whole library (driver gone, version mismatch)
or one GPU (fallen off the bus) become states that are reported and retried with
backoff. XID events come from sources.xid. Nothing here raises out of sample().
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from trainguard.i18n import N_
from trainguard.records import GpuProcess, GpuSample, NvmlState, NvmlStatus, XidEvent
from trainguard.sources.nvml import (
    ABSENT_CODES,
    GPU_IS_LOST,
    INIT_STATES,
    NO_PERMISSION,
    NOT_FOUND,
    REINIT_CODES,
    RETIREMENT_CAUSES,
    STATE_MESSAGES,
    Lost,
    Query,
    Reinit,
    code,
    load_nvml,
    raise_fatal,
    sample_value,
)
from trainguard.sources.procs import PidResolver
from trainguard.sources.xid import XidListener

__all__ = ["GpuReading", "GpuSampler", "load_nvml"]

log = logging.getLogger("trainguard.gpu")


@dataclass(frozen=True, slots=True)
class GpuReading:
    status: NvmlStatus
    gpus: tuple[GpuSample, ...]


def memory_health(q: Query, handle: Any) -> dict[str, Any]:
    """ECC and memory repair counters as GpuSample fields; a field the GPU lacks stays None.

    Pre-Ampere GPUs retire pages, Ampere and later remap rows; each reports NotSupported
    for the other, so a GPU has one set or the other (like dcgm-exporter's fields).
    """
    uncorrected = q.constant("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = q("ecc", "nvmlDeviceGetTotalEccErrors", handle, uncorrected, q.constant("NVML_VOLATILE_ECC", 0))
    aggregate = q("ecc_aggregate", "nvmlDeviceGetTotalEccErrors", handle, uncorrected,
                  q.constant("NVML_AGGREGATE_ECC", 1))
    by_cause: dict[str, int] = {}
    for cause, value in RETIREMENT_CAUSES.items():
        pages = q(f"retired_pages_{cause}", "nvmlDeviceGetRetiredPages", handle, value)
        if pages is not None:
            by_cause[cause] = len(pages)
    pending = q("retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    rows = q("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
    correctable, uncorrectable, remap_pending, remap_failure = rows if rows is not None else (None,) * 4
    return {
        "ecc_uncorrected": _int(volatile), "ecc_uncorrected_aggregate": _int(aggregate),
        "retired_pages": sum(by_cause.values()) if by_cause else None,
        "retired_pages_by_cause": by_cause or None,
        "retired_pages_pending": _bool(pending),
        "remapped_rows_correctable": _int(correctable), "remapped_rows_uncorrectable": _int(uncorrectable),
        "row_remap_pending": _bool(remap_pending), "row_remap_failure": _bool(remap_failure),
    }


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _bool(value: Any) -> bool | None:
    return bool(value) if value is not None else None


# ECC, retired-page and row-remap counters change over days and feed only metrics and status: read
# once a minute, not every cycle (7 of a GPU's 13 NVML calls; dcgm-exporter collects every 30 s).
HEALTH_EVERY = 60.0


class GpuSampler:
    """Samples every GPU each call; keeps NVML state, handles and backoff between calls."""

    def __init__(
        self,
        nvml: Any,
        *,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        host_pid_view: bool | None = None,
        retry_initial: float = 10.0,
        retry_max: float = 600.0,
        xid_events: bool = True,
    ):
        self.nvml = nvml
        self.clock = clock
        self.resolver = PidResolver(proc_root, host_pid_view)
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.xid_events = xid_events
        self._initialised = False
        self._handles: dict[int, Any] = {}
        self._identity: dict[int, tuple[str, str, int | None]] = {}
        self._absent: set[tuple[int, str]] = set()
        self._memory_v2 = True
        self._last_util_ts: dict[int, int] = {}
        self._health: dict[int, tuple[float, dict[str, Any]]] = {}  # index -> (read at, memory_health)
        self._lost_retry: dict[int, tuple[float, float]] = {}  # index -> (next retry, current delay)
        self._delay = retry_initial
        self._xid: XidListener | None = None
        # gpu index -> xid -> events since start: a Prometheus counter (resets with the daemon).
        self._xid_counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        self._status = NvmlStatus(NvmlState.ERROR, "not sampled yet")
        if nvml is None:
            self._status = NvmlStatus(NvmlState.NO_LIBRARY, N_("nvidia-ml-py (pynvml) is not installed: GPU monitoring is off"),
                                      since=clock())
            log.info(self._status.message)

    @property
    def status(self) -> NvmlStatus:
        return self._status

    # --- state ---------------------------------------------------------------------

    def _set_status(self, status: NvmlStatus) -> None:
        previous = self._status
        if status.state != previous.state or status.lost != previous.lost:
            status = replace(status, since=status.since or self.clock())
            if status.state == NvmlState.OK:
                log.info("GPU monitoring: %d GPU(s), driver %s", status.device_count, status.driver_version)
            elif status.state == NvmlState.NO_LIBRARY:
                log.info("%s", status.message)
            else:
                log.warning("GPU monitoring: %s", status.message)
        else:
            status = replace(status, since=previous.since)
        self._status = status

    def _fail(self, state: NvmlState, detail: str) -> None:
        now = self.clock()
        retry = now + self._delay
        message = STATE_MESSAGES.get(state, f"NVML error: {detail}")
        self._set_status(NvmlStatus(state, f"{message} (retry in {self._delay:.0f}s)", next_retry=retry))
        self._delay = min(self._delay * 2, self.retry_max)
        self._teardown()

    def _teardown(self) -> None:
        if self._xid is not None:
            self._xid.close()
            self._xid = None
        if self._initialised:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - the library is already broken
                pass
        self._initialised = False
        self._handles.clear()
        self._health.clear()

    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        nvml = self.nvml
        if nvml is None:
            return False
        retry = self._status.next_retry
        if retry is not None and self.clock() < retry:
            return False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            state = INIT_STATES.get(code(exc), NvmlState.ERROR)
            self._fail(state, str(exc))
            return False
        except OSError as exc:  # a broken library file
            self._fail(NvmlState.NO_LIBRARY, str(exc))
            return False
        self._initialised = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            for index in range(count):
                try:
                    self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                except nvml.NVMLError as exc:
                    if code(exc) not in (GPU_IS_LOST, NO_PERMISSION):
                        raise
                    self._lost_retry[index] = (self.clock() + self.retry_initial, self.retry_initial)
        except nvml.NVMLError as exc:
            self._fail(REINIT_CODES.get(code(exc), NvmlState.ERROR), str(exc))
            return False
        try:
            self._driver = str(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self._driver = ""
        self._count = count
        self._delay = self.retry_initial
        if self.xid_events and self._handles:
            self._xid = XidListener(nvml, dict(self._handles), self.clock)
        return True

    # --- sampling ------------------------------------------------------------------

    def sample(self) -> GpuReading:
        if not self._ensure_init():
            return GpuReading(self._status, ())
        now = self.clock()
        xid_by_gpu: dict[int, list[XidEvent]] = collections.defaultdict(list)
        if self._xid is not None:
            for event in self._xid.drain():
                xid_by_gpu[event.gpu_index].append(event)
                self._xid_counts[event.gpu_index][event.xid] += 1
        samples = []
        try:
            for index in range(self._count):
                samples.append(self._sample_gpu(index, now, tuple(xid_by_gpu.get(index, ()))))
        except Reinit as exc:
            self._fail(exc.state, str(exc))
            return GpuReading(self._status, ())
        lost = tuple(s.index for s in samples if s.lost)
        if lost:
            status = NvmlStatus(NvmlState.LOST, f"GPU {', '.join(map(str, lost))} lost (fallen off the bus?); "
                                "the others are still sampled", driver_version=self._driver,
                                device_count=self._count, lost=lost,
                                next_retry=min(self._lost_retry[i][0] for i in lost))
        else:
            status = NvmlStatus(NvmlState.OK, "", driver_version=self._driver, device_count=self._count)
        self._set_status(status)
        return GpuReading(self._status, tuple(samples))

    def _lost_sample(self, index: int, now: float, detail: str) -> GpuSample:
        retry, delay = self._lost_retry.get(index, (now, self.retry_initial / 2))
        if retry <= now:
            delay = min(delay * 2, self.retry_max)
            self._lost_retry[index] = (now + delay, delay)
        uuid, name, _minor = self._identity.get(index, ("", "", None))
        return GpuSample(index, uuid, name, now, lost=True, errors={"gpu": detail},
                         xid_counts=dict(self._xid_counts.get(index, {})))

    def _sample_gpu(self, index: int, now: float, xids: tuple[XidEvent, ...]) -> GpuSample:
        nvml = self.nvml
        if index in self._lost_retry:
            if now < self._lost_retry[index][0]:
                return self._lost_sample(index, now, "GPU is lost")
            try:
                self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                if code(exc) in REINIT_CODES:
                    raise Reinit(REINIT_CODES[code(exc)], str(exc)) from None
                return self._lost_sample(index, now, str(exc))
        handle = self._handles[index]
        q = Query(nvml, index, self._absent)
        try:
            if index not in self._identity:
                self._identity[index] = (str(q("uuid", "nvmlDeviceGetUUID", handle) or ""),
                                         str(q("name", "nvmlDeviceGetName", handle) or ""),
                                         q("minor_number", "nvmlDeviceGetMinorNumber", handle))
            uuid, name, minor = self._identity[index]
            used, total = self._memory(q, handle)
            util, util_max = self._utilisation(q, index, handle)
            temperature = q("temperature", "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
            power_mw = q("power", "nvmlDeviceGetPowerUsage", handle)
            limit_mw = q("power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle)
            throttle = q("throttle", ("nvmlDeviceGetCurrentClocksEventReasons",
                                      "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
            procs = q("processes", ("nvmlDeviceGetComputeRunningProcesses",
                                    "nvmlDeviceGetComputeRunningProcesses_v3",
                                    "nvmlDeviceGetComputeRunningProcesses_v2"), handle) or []
            read = self._health.get(index)
            if read is None or not 0 <= now - read[0] < HEALTH_EVERY:
                read = self._health[index] = (now, memory_health(q, handle))
            health = read[1]
        except Lost as exc:
            self._lost_retry.setdefault(index, (now, self.retry_initial / 2))
            return self._lost_sample(index, now, str(exc))
        self._lost_retry.pop(index, None)
        return GpuSample(
            index=index, uuid=uuid, name=name, ts=now,
            util_ratio=util, util_max_ratio=util_max,
            memory_used_bytes=used, memory_total_bytes=total,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            throttle_reasons=int(throttle) if throttle is not None else None,
            processes=self._processes(procs),
            xid_events=xids, xid_counts=dict(self._xid_counts.get(index, {})),
            errors=q.errors, minor_number=int(minor) if minor is not None else None, **health,
        )

    def _memory(self, q: Query, handle: Any) -> tuple[int | None, int | None]:
        info = None
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if self._memory_v2 and version is not None:
            try:
                info = q("memory_v2", "nvmlDeviceGetMemoryInfo", handle, version=version)
            except TypeError:  # an nvidia-ml-py without the version argument
                info = None
            if info is None and "memory_v2" not in q.errors:
                self._memory_v2 = False  # v2 not supported by this driver: v1 from now on
        if info is None:
            info = q("memory", "nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return None, None
        return int(info.used), int(info.total)

    def _utilisation(self, q: Query, index: int, handle: Any) -> tuple[float | None, float | None]:
        """Mean and max of the driver's own utilisation samples since the last call.

        The driver samples utilisation several times a second; reading its buffer means a
        busy burst between two of our cycles is not missed. Falls back to the instantaneous rate.
        """
        nvml = self.nvml
        values: list[float] = []
        if (index, "samples") not in self._absent and hasattr(nvml, "nvmlDeviceGetSamples"):
            last = self._last_util_ts.get(index, 0)
            try:
                value_type, samples = nvml.nvmlDeviceGetSamples(
                    handle, getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1), last)
                newest = last
                for s in samples:
                    ts = int(s.timeStamp)
                    if ts > last:
                        values.append(sample_value(value_type, s.sampleValue))
                        newest = max(newest, ts)
                self._last_util_ts[index] = newest
            except nvml.NVMLError as exc:
                raise_fatal(exc)
                if code(exc) in ABSENT_CODES:
                    self._absent.add((index, "samples"))
                elif code(exc) != NOT_FOUND:  # NOT_FOUND: no new samples since `last`
                    q.errors["samples"] = str(exc)
        if values:
            return sum(values) / len(values) / 100, max(values) / 100
        rates = q("utilization", "nvmlDeviceGetUtilizationRates", handle)
        if rates is not None:
            return rates.gpu / 100, rates.gpu / 100
        return None, None

    def _processes(self, infos: list[Any]) -> tuple[GpuProcess, ...]:
        by_pid: dict[int, int | None] = {}
        for info in infos:
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            # One PID may appear per MIG instance; add its memory up.
            if pid in by_pid and by_pid[pid] is not None and used is not None:
                by_pid[pid] = by_pid[pid] + int(used)  # type: ignore[operator]
            else:
                by_pid[pid] = int(used) if used is not None else by_pid.get(pid)
        resolved = self.resolver.resolve(list(by_pid))
        return tuple(
            GpuProcess(host_pid=pid, pid=r.pid, used_memory_bytes=by_pid[pid], state=r.state, exists=r.exists,
                       ns_pid=r.ns_pid, name=r.name, note=r.note)
            for pid, r in resolved.items()
        )

    def close(self) -> None:
        self._teardown()
