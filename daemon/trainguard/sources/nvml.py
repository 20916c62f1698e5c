"""The NVML boundary: return codes, the one query helper, and the names of NVML bit fields.

The NVML module is a parameter everywhere: production passes the real pynvml
(nvidia-ml-py), tests a fake with scripted timelines. Every per-device call goes
through `Query`, which turns "not supported on this GPU/driver" into an absent field
(and stops asking), other errors into a per-sample error text, and the errors that
invalidate the library (driver gone, version mismatch) or one GPU (fallen off the bus)
into exceptions the sampler turns into states.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from trainguard.records import NvmlState
from trainguard.i18n import N_

# NVML return codes (stable C API values).
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNINITIALIZED = 1
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25

# "Absent" codes: the field does not exist on this GPU/driver. Ask once, then not again.
ABSENT_CODES = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
# Codes after which the library handle is useless until re-initialised.
REINIT_CODES = {
    UNINITIALIZED: NvmlState.ERROR,
    DRIVER_NOT_LOADED: NvmlState.NO_DRIVER,
    LIB_RM_VERSION_MISMATCH: NvmlState.MISMATCH,
    LIBRARY_NOT_FOUND: NvmlState.NO_LIBRARY,
}
# nvmlInit failures -> state.
INIT_STATES = {
    LIBRARY_NOT_FOUND: NvmlState.NO_LIBRARY,
    DRIVER_NOT_LOADED: NvmlState.NO_DRIVER,
    LIB_RM_VERSION_MISMATCH: NvmlState.MISMATCH,
    NO_PERMISSION: NvmlState.NO_PERMISSION,
}

XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError

# Marked for the catalog: status and health print them in the notify language.
STATE_MESSAGES = {
    NvmlState.NO_LIBRARY: N_("no NVIDIA management library (libnvidia-ml.so.1): GPU monitoring is off on this host"),
    NvmlState.NO_DRIVER: N_("NVIDIA kernel driver is not loaded: GPU monitoring paused"),
    NvmlState.MISMATCH: N_("NVML library and kernel driver versions differ (driver updated without a reboot?)"),
    NvmlState.NO_PERMISSION: N_("no permission to open the NVIDIA devices (/dev/nvidia*)"),
}

# nvmlClocksEventReason* bits -> the reason label trainguard exports (and the config names).
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
}

# nvmlPageRetirementCause values -> label.
RETIREMENT_CAUSES = {"single_bit": 0, "double_bit": 1}


def load_nvml() -> ModuleType | None:
    """The installed pynvml module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class Lost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


class Reinit(Exception):
    """The library handle is useless: re-initialise later."""

    def __init__(self, state: NvmlState, text: str):
        super().__init__(text)
        self.state = state


def code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def raise_fatal(exc: BaseException) -> None:
    """Re-raise a lost GPU or a broken library as Lost / Reinit; return for any other error."""
    value = code(exc)
    if value == GPU_IS_LOST:
        raise Lost(str(exc)) from None
    if value in REINIT_CODES:
        raise Reinit(REINIT_CODES[value], str(exc)) from None


class Query:
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
                if code(exc) in ABSENT_CODES:
                    continue
                raise_fatal(exc)
                self.errors[field] = str(exc)
                return None
        self.absent.add((self.index, field))
        return None

    def constant(self, name: str, default: int) -> int:
        return getattr(self.nvml, name, default)


def sample_value(value_type: int, value: Any) -> float:
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(value_type, "uiVal")
    return float(getattr(value, attr))
