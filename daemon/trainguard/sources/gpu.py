"""GPU sampling through NVML (nvidia-ml-py, import name pynvml).

The NVML module is a parameter: production passes the real pynvml, tests a fake with
scripted timelines. Every NVML call goes through one query helper that turns "not
supported on this GPU/driver" into an absent field (and stops asking), other errors
into a per-sample error text, and the few errors that invalidate the whole library
(driver gone, version mismatch) or one GPU (fallen off the bus) into states that are
reported and retried with backoff. Nothing here raises out of sample().
"""

from __future__ import annotations

import collections
import importlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Callable

from trainguard.records import GpuProcess, GpuSample, NvmlState, NvmlStatus, XidEvent
from trainguard.sources.procs import PidResolver

log = logging.getLogger("trainguard.gpu")

# NVML return codes (stable C API values; read from the module when it has them).
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_UNINITIALIZED = 1
_LIB_RM_VERSION_MISMATCH = 18
_ARGUMENT_VERSION_MISMATCH = 25

# "Absent" codes: the field does not exist on this GPU/driver. Ask once, then not again.
_ABSENT_CODES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH})
# Codes after which the library handle is useless until re-initialised.
_REINIT_CODES = {
    _UNINITIALIZED: NvmlState.ERROR,
    _DRIVER_NOT_LOADED: NvmlState.NO_DRIVER,
    _LIB_RM_VERSION_MISMATCH: NvmlState.MISMATCH,
    _LIBRARY_NOT_FOUND: NvmlState.NO_LIBRARY,
}

_XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError

_STATE_MESSAGES = {
    NvmlState.NO_LIBRARY: "no NVIDIA management library (libnvidia-ml.so.1): GPU monitoring is off on this host",
    NvmlState.NO_DRIVER: "NVIDIA kernel driver is not loaded: GPU monitoring paused",
    NvmlState.MISMATCH: "NVML library and kernel driver versions differ (driver updated without a reboot?)",
    NvmlState.NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
}

# Bit -> name for the throttle reasons trainguard reports (nvmlClocksEventReason*).
def load_nvml() -> ModuleType | None:
    """The installed pynvml module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


@dataclass(frozen=True, slots=True)
class GpuReading:
    status: NvmlStatus
    gpus: tuple[GpuSample, ...]


class _Lost(Exception):
    pass


class _Reinit(Exception):
    def __init__(self, state: NvmlState, text: str):
        super().__init__(text)
        self.state = state


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class _Query:
    """The one NVML call helper: value, or None with the reason recorded."""

    def __init__(self, nvml: Any, index: int, absent: set[tuple[int, str]]):
        self.nvml = nvml
        self.index = index
        self.absent = absent
        self.errors: dict[str, str] = {}

    def __call__(self, field: str, names: tuple[str, ...] | str, *args: Any, **kwargs: Any) -> Any:
        if (self.index, field) in self.absent:
            return None
        for name in (names,) if isinstance(names, str) else names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue  # older nvidia-ml-py without this function: try the next spelling
            try:
                return fn(*args, **kwargs)
            except self.nvml.NVMLError as exc:
                code = _code(exc)
                if code in _ABSENT_CODES:
                    continue
                if code == _GPU_IS_LOST:
                    raise _Lost(str(exc)) from None
                if code in _REINIT_CODES:
                    raise _Reinit(_REINIT_CODES[code], str(exc)) from None
                self.errors[field] = str(exc)
                return None
        self.absent.add((self.index, field))
        return None


def _sample_value(value_type: int, value: Any) -> float:
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(value_type, "uiVal")
    return float(getattr(value, attr))


class XidListener:
    """Waits for XID events in its own thread (nvmlEventSetWait blocks) and queues them."""

    def __init__(self, nvml: Any, handles: dict[int, Any], clock: Callable[[], float], wait_ms: int = 500):
        self.nvml = nvml
        self.clock = clock
        self.wait_ms = wait_ms
        self._queue: collections.deque[XidEvent] = collections.deque(maxlen=1000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle_index: list[tuple[Any, int]] = []
        self.event_set = None
        self.supported: tuple[int, ...] = ()
        try:
            self.event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("XID events not available: %s", exc)
            return
        supported = []
        for index, handle in handles.items():
            try:
                if nvml.nvmlDeviceGetSupportedEventTypes(handle) & _XID_EVENT:
                    nvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, self.event_set)
                    supported.append(index)
                    self._handle_index.append((handle, index))
            except nvml.NVMLError as exc:
                log.info("GPU %d: XID events not available: %s", index, exc)
        self.supported = tuple(supported)
        if supported:
            self._thread = threading.Thread(target=self._run, name="trainguard-xid", daemon=True)
            self._thread.start()

    def _index_of(self, device: Any) -> int:
        for handle, index in self._handle_index:
            if handle is device or handle == device:
                return index
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except Exception:  # noqa: BLE001 - an event for an unknown handle still counts
            return -1

    def _run(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait(self.event_set, self.wait_ms)
            except self.nvml.NVMLError as exc:
                if _code(exc) == _TIMEOUT:
                    continue
                log.warning("waiting for XID events failed: %s (retrying in %.0fs)", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)
                continue
            delay = 1.0
            if int(data.eventType) & _XID_EVENT:
                self._queue.append(XidEvent(self._index_of(data.device), int(data.eventData), self.clock()))

    def drain(self) -> list[XidEvent]:
        events = []
        while self._queue:
            events.append(self._queue.popleft())
        return events

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 2)
        if self.event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass


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
        self._lost_retry: dict[int, tuple[float, float]] = {}  # index -> (next retry, current delay)
        self._delay = retry_initial
        self._xid: XidListener | None = None
        self._status = NvmlStatus(NvmlState.ERROR, "not sampled yet")
        if nvml is None:
            self._status = NvmlStatus(NvmlState.NO_LIBRARY, "nvidia-ml-py (pynvml) is not installed: GPU monitoring is off",
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
        message = _STATE_MESSAGES.get(state, f"NVML error: {detail}")
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
            code = _code(exc)
            state = {
                _LIBRARY_NOT_FOUND: NvmlState.NO_LIBRARY,
                _DRIVER_NOT_LOADED: NvmlState.NO_DRIVER,
                _LIB_RM_VERSION_MISMATCH: NvmlState.MISMATCH,
                _NO_PERMISSION: NvmlState.NO_PERMISSION,
            }.get(code, NvmlState.ERROR)
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
                    if _code(exc) not in (_GPU_IS_LOST, _NO_PERMISSION):
                        raise
                    self._lost_retry[index] = (self.clock() + self.retry_initial, self.retry_initial)
        except nvml.NVMLError as exc:
            self._fail(_REINIT_CODES.get(_code(exc), NvmlState.ERROR), str(exc))
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
        samples = []
        try:
            for index in range(self._count):
                samples.append(self._sample_gpu(index, now, tuple(xid_by_gpu.get(index, ()))))
        except _Reinit as exc:
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
        return GpuSample(index, uuid, name, now, lost=True, errors={"gpu": detail})

    def _sample_gpu(self, index: int, now: float, xids: tuple[XidEvent, ...]) -> GpuSample:
        nvml = self.nvml
        if index in self._lost_retry:
            if now < self._lost_retry[index][0]:
                return self._lost_sample(index, now, "GPU is lost")
            try:
                self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                if _code(exc) in _REINIT_CODES:
                    raise _Reinit(_REINIT_CODES[_code(exc)], str(exc)) from None
                return self._lost_sample(index, now, str(exc))
        handle = self._handles[index]
        q = _Query(nvml, index, self._absent)
        try:
            if index not in self._identity:
                self._identity[index] = (str(q("uuid", "nvmlDeviceGetUUID", handle) or ""),
                                         str(q("name", "nvmlDeviceGetName", handle) or ""),
                                         q("minor_number", "nvmlDeviceGetMinorNumber", handle))
            uuid, name, minor = self._identity[index]
            used, total = self._memory(q, handle)
            util, util_max, mem_util = self._utilisation(q, index, handle)
            temperature = q("temperature", "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
            power_mw = q("power", "nvmlDeviceGetPowerUsage", handle)
            limit_mw = q("power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle)
            throttle = q("throttle", ("nvmlDeviceGetCurrentClocksEventReasons",
                                      "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
            procs = q("processes", ("nvmlDeviceGetComputeRunningProcesses",
                                    "nvmlDeviceGetComputeRunningProcesses_v3",
                                    "nvmlDeviceGetComputeRunningProcesses_v2"), handle) or []
            ecc = q("ecc", "nvmlDeviceGetTotalEccErrors", handle,
                    getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), getattr(nvml, "NVML_VOLATILE_ECC", 0))
            retired = None
            for cause in (0, 1):  # multiple single-bit, double-bit
                pages = q("retired_pages", "nvmlDeviceGetRetiredPages", handle, cause)
                if pages is not None:
                    retired = (retired or 0) + len(pages)
            pending = q("retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        except _Lost as exc:
            self._lost_retry.setdefault(index, (now, self.retry_initial / 2))
            return self._lost_sample(index, now, str(exc))
        self._lost_retry.pop(index, None)
        return GpuSample(
            index=index, uuid=uuid, name=name, ts=now,
            util_ratio=util, util_max_ratio=util_max, mem_util_ratio=mem_util,
            memory_used_bytes=used, memory_total_bytes=total,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            throttle_reasons=int(throttle) if throttle is not None else None,
            processes=self._processes(procs),
            xid_events=xids,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            retired_pages=retired,
            retired_pages_pending=bool(pending) if pending is not None else None,
            errors=q.errors, minor_number=int(minor) if minor is not None else None,
        )

    def _memory(self, q: _Query, handle: Any) -> tuple[int | None, int | None]:
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

    def _utilisation(self, q: _Query, index: int, handle: Any) -> tuple[float | None, float | None, float | None]:
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
                        values.append(_sample_value(value_type, s.sampleValue))
                        newest = max(newest, ts)
                self._last_util_ts[index] = newest
            except nvml.NVMLError as exc:
                code = _code(exc)
                if code == _GPU_IS_LOST:
                    raise _Lost(str(exc)) from None
                if code in _REINIT_CODES:
                    raise _Reinit(_REINIT_CODES[code], str(exc)) from None
                if code in _ABSENT_CODES:
                    self._absent.add((index, "samples"))
                elif code != _NOT_FOUND:  # NOT_FOUND: no new samples since `last`
                    q.errors["samples"] = str(exc)
        rates = q("utilization", "nvmlDeviceGetUtilizationRates", handle)
        mem_util = rates.memory / 100 if rates is not None else None
        if values:
            return sum(values) / len(values) / 100, max(values) / 100, mem_util
        if rates is not None:
            return rates.gpu / 100, rates.gpu / 100, mem_util
        return None, None, mem_util

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
