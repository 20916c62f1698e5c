"""A scripted stand-in for nvidia-ml-py's `pynvml`, faithful at the module boundary.

Same function names, return objects with the same attribute names, the same
NVMLError class hierarchy (NVMLError(code) returns the NVMLError_<Name> subclass) and
the same constant values as the real module; tests/test_fake_nvml.py checks them
against the installed nvidia-ml-py.

Two ways to use it:
- in-process: `FakeNvml(script, clock=fake_clock)` is an object with the module's API;
  pass it to GpuSampler as the NVML module.
- in a subprocess: put this directory first on PYTHONPATH, so `import pynvml` finds
  this file, and point TRAINGUARD_FAKE_NVML at a JSON script.

Script (JSON / dict); times are seconds since t0 (script "t0" epoch, else creation):
{
  "driver_version": "550.54.15",
  "init": [{"at": 0, "error": "DRIVER_NOT_LOADED"}, {"at": 30, "error": null}],
  "sample_period_s": 1.0,                # driver utilisation sample spacing
  "gpus": [{
    "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-...", "memory_total": 85899345920,
    "minor_number": 0,                     # N of /dev/nvidiaN (default: the index)
    "unsupported": ["nvmlDeviceGetTemperature", ...],   # always NOT_SUPPORTED
    "heartbeat": {"path": "/tmp/hb", "fresh_s": 2, "busy": 97, "idle": 0},  # util from a file's mtime
    "timeline": [                         # step function; each entry overrides the previous
      {"at": 0, "util": 95, "mem_used": 80e9, "processes": [{"pid": 123, "used": 80e9}],
       "temperature": 70, "power_w": 300, "power_limit_w": 400, "throttle": 0, "ecc_uncorrected": 0,
       "retired_pages": [], "xid": [79], "lost": false, "errors": {"nvmlDeviceGetPowerUsage": "UNKNOWN"},
       "ecc_uncorrected_aggregate": 3,     # lifetime count; default: the volatile one
       "remapped_rows": [2, 1, 0, 0]}     # correctable, uncorrectable, pending, failure (Ampere+)
    ]}]
}
"""

from __future__ import annotations

import bisect
import collections
import json
import os
import string
import sys
import threading
import time

# --- constants (values as in nvidia-ml-py) -------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
NVML_TOTAL_POWER_SAMPLES = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
nvmlMemory_v2 = 0x02000028

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypeNone = 0x0000000000000000

nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = 0x0000000000000001
nvmlClocksThrottleReasonSwPowerCap = 0x0000000000000004
nvmlClocksThrottleReasonHwSlowdown = 0x0000000000000008
nvmlClocksThrottleReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksThrottleReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksThrottleReasonNone = 0x0000000000000000


# --- errors: the same construction as the real module ----------------------------------
class NVMLError(Exception):
    _valClassMapping: dict = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other):
        return self.value == other.value

    def __hash__(self):
        return hash(self.value)


def nvmlExceptionClass(nvmlErrorCode):
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError("nvmlErrorCode %s is not valid" % nvmlErrorCode)
    return NVMLError._valClassMapping[nvmlErrorCode]


def _extractNVMLErrorsAsClasses():
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


def _error(name_or_code) -> NVMLError:
    code = name_or_code if isinstance(name_or_code, int) else globals()["NVML_ERROR_" + str(name_or_code)]
    return NVMLError(code)


# --- return objects (attribute names as the real ctypes structures) ---------------------
class _Struct:
    _fields_: tuple = ()

    def __init__(self, **values):
        for name in self._fields_:
            setattr(self, name, values.get(name, 0))

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (n, getattr(self, n)) for n in self._fields_))


class c_nvmlMemory_t(_Struct):
    _fields_ = ("total", "free", "used")


class c_nvmlMemory_v2_t(_Struct):
    _fields_ = ("version", "total", "reserved", "free", "used")


class c_nvmlUtilization_t(_Struct):
    _fields_ = ("gpu", "memory")


class c_nvmlValue_t(_Struct):
    _fields_ = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class c_nvmlSample_t(_Struct):
    _fields_ = ("timeStamp", "sampleValue")


class c_nvmlEventData_t(_Struct):
    _fields_ = ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId")


class nvmlFriendlyObject(object):
    def __init__(self, dictionary):
        for x in dictionary:
            setattr(self, x, dictionary[x])

    def __str__(self):
        return self.__dict__.__str__()


class _Handle:
    """Stands in for c_nvmlDevice_t: an opaque per-device object."""

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return "<fake nvmlDevice %d>" % self.index


class _EventSet:
    def __init__(self):
        self.handles = []
        self.freed = False


# --- the scripted library --------------------------------------------------------------
_DEVICE_FUNCTIONS = (
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetMinorNumber",
)
API = _DEVICE_FUNCTIONS + (
    "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount",
    "nvmlEventSetCreate", "nvmlEventSetWait", "nvmlEventSetFree", "nvmlErrorString",
)


class _Gpu:
    def __init__(self, index, spec):
        self.index = index
        self.handle = _Handle(index)
        self.name = spec.get("name", "NVIDIA A100-SXM4-80GB")
        self.uuid = spec.get("uuid", "GPU-%08d-fake-0000-0000-%012d" % (index, index))
        self.memory_total = int(spec.get("memory_total", 80 * 1024**3))
        self.minor_number = int(spec.get("minor_number", index))  # N of /dev/nvidiaN
        self.unsupported = frozenset(spec.get("unsupported", ()))
        self.heartbeat = spec.get("heartbeat")
        timeline = sorted(spec.get("timeline", [{"at": 0}]), key=lambda e: e.get("at", 0))
        self.times = []
        self.states = []
        self.xids = []  # (at, code)
        state = {"util": 0, "mem_util": 0, "mem_used": 0, "processes": [], "temperature": 40, "power_w": 60.0,
                 "power_limit_w": 400.0, "throttle": 0, "ecc_uncorrected": 0, "retired_pages": [],
                 "retired_pending": 0, "lost": False, "errors": {}, "ecc_uncorrected_aggregate": None,
                 "remapped_rows": [0, 0, 0, 0]}
        for entry in timeline:
            state = dict(state)
            state["errors"] = {}  # errors hold for one phase only
            state.update({k: v for k, v in entry.items() if k not in ("at", "xid")})
            self.times.append(float(entry.get("at", 0)))
            self.states.append(state)
            for code in entry.get("xid", ()):
                self.xids.append((float(entry.get("at", 0)), int(code)))
        self.xids_sent = 0

    def state_at(self, elapsed):
        i = bisect.bisect_right(self.times, elapsed) - 1
        return self.states[max(i, 0)] if self.states else {}

    def util_at(self, elapsed, wall):
        if self.heartbeat:
            try:
                age = wall - os.stat(self.heartbeat["path"]).st_mtime
            except OSError:
                age = float("inf")
            fresh = age <= float(self.heartbeat.get("fresh_s", 2.0))
            return int(self.heartbeat.get("busy", 97) if fresh else self.heartbeat.get("idle", 0))
        return int(self.state_at(elapsed).get("util", 0))


class FakeNvml:
    """The pynvml API over a script. Constants and error classes are this module's."""

    def __init__(self, script=None, clock=time.time, t0=None):
        script = script or {}
        self.clock = clock
        self.t0 = float(script.get("t0", t0 if t0 is not None else clock()))
        self.driver_version = script.get("driver_version", "550.54.15")
        self.sample_period = float(script.get("sample_period_s", 1.0))
        self.sample_buffer = int(script.get("sample_buffer", 120))
        init = script.get("init")
        if init is None and script.get("init_error"):
            init = [{"at": 0, "error": script["init_error"]}]
        self.init_schedule = sorted(init or [{"at": 0, "error": None}], key=lambda e: e.get("at", 0))
        self.gpus = [_Gpu(i, spec) for i, spec in enumerate(script.get("gpus", []))]
        self.initialised = 0
        self.calls = collections.Counter()
        self._lock = threading.Lock()

    # module-like access to constants and error classes
    def __getattr__(self, name):
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(name) from None

    def elapsed(self):
        return self.clock() - self.t0

    def _check_init(self):
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, fn, handle):
        self.calls[fn] += 1
        self._check_init()
        if not isinstance(handle, _Handle) or handle.index >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        state = gpu.state_at(self.elapsed())
        if state.get("lost"):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if fn in state.get("errors", {}):
            raise _error(state["errors"][fn])
        return gpu, state

    # library
    def nvmlInit(self):
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags):
        self.calls["nvmlInit"] += 1
        elapsed = self.elapsed()
        error = None
        for entry in self.init_schedule:
            if entry.get("at", 0) <= elapsed:
                error = entry.get("error")
        if error:
            raise _error(error)
        with self._lock:
            self.initialised += 1

    def nvmlShutdown(self):
        self.calls["nvmlShutdown"] += 1
        self._check_init()
        with self._lock:
            self.initialised -= 1

    def nvmlErrorString(self, result):
        return NVMLError._errcode_to_string.get(result, "Unknown Error")

    def nvmlSystemGetDriverVersion(self):
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self):
        self.calls["nvmlDeviceGetCount"] += 1
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.state_at(self.elapsed()).get("lost"):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

    # device queries
    def nvmlDeviceGetIndex(self, handle):
        return self._device("nvmlDeviceGetIndex", handle)[0].index

    def nvmlDeviceGetMinorNumber(self, handle):
        return self._device("nvmlDeviceGetMinorNumber", handle)[0].minor_number

    def nvmlDeviceGetName(self, handle):
        return self._device("nvmlDeviceGetName", handle)[0].name

    def nvmlDeviceGetUUID(self, handle):
        return self._device("nvmlDeviceGetUUID", handle)[0].uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu, state = self._device("nvmlDeviceGetMemoryInfo", handle)
        used = int(state.get("mem_used", 0))
        if not version:
            return c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)
        if "nvmlDeviceGetMemoryInfo_v2" in gpu.unsupported:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)  # what an old libnvidia-ml gives
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        reserved = 512 * 1024**2
        return c_nvmlMemory_v2_t(version=version, total=gpu.memory_total, reserved=reserved,
                                 free=gpu.memory_total - used - reserved, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu, state = self._device("nvmlDeviceGetUtilizationRates", handle)
        return c_nvmlUtilization_t(gpu=gpu.util_at(self.elapsed(), time.time()), memory=int(state.get("mem_util", 0)))

    def nvmlDeviceGetSamples(self, device, sampling_type, timeStamp):
        gpu, _state = self._device("nvmlDeviceGetSamples", device)
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        elapsed = self.elapsed()
        wall = time.time()
        newest_k = int(elapsed // self.sample_period)
        since = (timeStamp / 1e6 - self.t0) if timeStamp else -1.0
        first_k = max(newest_k - self.sample_buffer + 1, 0, int(since // self.sample_period) + 1)
        samples = []
        for k in range(first_k, newest_k + 1):
            at = k * self.sample_period
            us = int(round((self.t0 + at) * 1e6))
            if us <= timeStamp:
                continue
            samples.append(c_nvmlSample_t(timeStamp=us, sampleValue=c_nvmlValue_t(uiVal=gpu.util_at(at, wall))))
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return (NVML_VALUE_TYPE_UNSIGNED_INT, samples)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return int(self._device("nvmlDeviceGetTemperature", handle)[1]["temperature"])

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(float(self._device("nvmlDeviceGetPowerUsage", handle)[1]["power_w"]) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return int(float(self._device("nvmlDeviceGetEnforcedPowerLimit", handle)[1]["power_limit_w"]) * 1000)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return int(self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)[1]["throttle"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return int(self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)[1]["throttle"])

    def _procs(self, fn, handle):
        _gpu, state = self._device(fn, handle)
        out = []
        for p in state.get("processes", []):
            pid, used = (p["pid"], p.get("used")) if isinstance(p, dict) else (p[0], p[1])
            out.append(nvmlFriendlyObject({"pid": int(pid), "usedGpuMemory": None if used is None else int(used),
                                           "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._procs("nvmlDeviceGetComputeRunningProcesses", handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        state = self._device("nvmlDeviceGetTotalEccErrors", handle)[1]
        if errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0  # corrected errors are not scripted
        volatile = int(state["ecc_uncorrected"])
        if counterType == NVML_VOLATILE_ECC:
            return volatile
        if counterType != NVML_AGGREGATE_ECC:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        aggregate = state.get("ecc_uncorrected_aggregate")
        return volatile if aggregate is None else int(aggregate)

    def nvmlDeviceGetRemappedRows(self, device):
        corr, unc, pending, failure = self._device("nvmlDeviceGetRemappedRows", device)[1]["remapped_rows"]
        return (int(corr), int(unc), int(pending), int(failure))

    def nvmlDeviceGetRetiredPages(self, device, sourceFilter):
        pages = self._device("nvmlDeviceGetRetiredPages", device)[1]["retired_pages"]
        return [int(p) for i, p in enumerate(pages) if i % 2 == sourceFilter]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device):
        return int(self._device("nvmlDeviceGetRetiredPagesPendingStatus", device)[1]["retired_pending"])

    # events
    def nvmlDeviceGetSupportedEventTypes(self, handle):
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        self._device("nvmlDeviceRegisterEvents", handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            eventSet.handles.append(handle)

    def nvmlEventSetCreate(self):
        self.calls["nvmlEventSetCreate"] += 1
        self._check_init()
        return _EventSet()

    def nvmlEventSetFree(self, eventSet):
        eventSet.freed = True

    def nvmlEventSetWait(self, eventSet, timeoutms):
        self.calls["nvmlEventSetWait"] += 1
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            self._check_init()
            elapsed = self.elapsed()
            with self._lock:
                for handle in eventSet.handles:
                    gpu = self.gpus[handle.index]
                    if gpu.xids_sent < len(gpu.xids) and gpu.xids[gpu.xids_sent][0] <= elapsed:
                        code = gpu.xids[gpu.xids_sent][1]
                        gpu.xids_sent += 1
                        return c_nvmlEventData_t(device=handle, eventType=nvmlEventTypeXidCriticalError,
                                                 eventData=code, gpuInstanceId=0xFFFFFFFF,
                                                 computeInstanceId=0xFFFFFFFF)
            if time.monotonic() >= deadline:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            with self._lock:
                pending = any(self.gpus[h.index].xids_sent < len(self.gpus[h.index].xids) for h in eventSet.handles)
            # Nothing scripted is left to come: block for the whole timeout, as the driver does (polling
            # every 20 ms would charge the fake's wake-ups to the daemon in bench/cycle_cpu.py).
            time.sleep(min(0.02 if pending else deadline, max(deadline - time.monotonic(), 0)))


# --- module-level API for `import pynvml` in a subprocess --------------------------------
_instance = None
_instance_lock = threading.Lock()


def _default():
    global _instance
    with _instance_lock:
        if _instance is None:
            path = os.environ.get("TRAINGUARD_FAKE_NVML")
            if path:
                with open(path) as fh:
                    script = json.load(fh)
            else:
                script = {"init_error": "LIBRARY_NOT_FOUND"}
            _instance = FakeNvml(script)
        return _instance


def _forward(name):
    def call(*args, **kwargs):
        return getattr(_default(), name)(*args, **kwargs)
    call.__name__ = name
    return call


for _name in API:
    globals()[_name] = _forward(_name)
del _name
