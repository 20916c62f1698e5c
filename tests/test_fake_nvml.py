"""The fake pynvml must mirror the installed nvidia-ml-py where trainguard touches it,
or tests on the fake would pass against an API that does not exist."""

from __future__ import annotations

import ctypes

import pytest

from tests.gpu_support import fake_pynvml

real = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


def test_error_codes_and_classes_match():
    codes = {n: getattr(real, n) for n in dir(real) if n.startswith("NVML_ERROR_")}
    for name, value in codes.items():
        assert getattr(fake_pynvml, name) == value, name
        cls = real.NVMLError._valClassMapping[value].__name__
        assert fake_pynvml.NVMLError._valClassMapping[value].__name__ == cls
        # NVMLError(code) returns the subclass, as code in trainguard relies on.
        assert type(fake_pynvml.NVMLError(value)).__name__ == type(real.NVMLError(value)).__name__
    assert str(fake_pynvml.NVMLError_NotSupported()) == "Not Supported"
    assert isinstance(fake_pynvml.NVMLError(3), fake_pynvml.NVMLError_NotSupported)


def test_constants_match():
    for name in dir(fake_pynvml):
        if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks", "nvmlMemory_v2")):
            assert getattr(real, name) == getattr(fake_pynvml, name), name


def test_functions_and_struct_fields_exist_in_the_real_module():
    for name in fake_pynvml.API:
        assert callable(getattr(real, name)), name
    for name in ("c_nvmlMemory_t", "c_nvmlMemory_v2_t", "c_nvmlUtilization_t", "c_nvmlSample_t",
                 "c_nvmlEventData_t", "c_nvmlValue_t"):
        real_fields = tuple(f[0] for f in getattr(real, name)._fields_)
        assert getattr(fake_pynvml, name)._fields_ == real_fields, name
    proc_fields = tuple(f[0] for f in real.c_nvmlProcessInfo_t._fields_)
    fake = fake_pynvml.FakeNvml({"gpus": [{"timeline": [{"at": 0, "processes": [{"pid": 1, "used": 5}]}]}]})
    fake.nvmlInit()
    (info,) = fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    assert tuple(vars(info)) == proc_fields
    assert isinstance(real.c_nvmlSample_t().sampleValue, ctypes.Union)


def test_uninitialised_calls_and_missing_library_behave_like_the_real_module():
    fake = fake_pynvml.FakeNvml({"init_error": "LIBRARY_NOT_FOUND"})
    with pytest.raises(fake_pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    with pytest.raises(fake_pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
