"""The parts of scripts/gpu-selftest that do not need a GPU (the script itself runs on GPU hosts)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest
from trainguard.records import GpuSample

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-selftest"


@pytest.fixture(scope="module")
def selftest():
    loader = importlib.machinery.SourceFileLoader("gpu_selftest", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_selftest", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


SMI = """0, GPU-5f3b2c1a-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 81559, 1234, 0, 34, 71.52, 700.00
1, GPU-aaaaaaaa-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 81559, 77000, 98, [N/A], [N/A], [N/A]
"""


def test_parses_nvidia_smi_csv(selftest):
    rows = selftest.parse_smi_csv(SMI)
    assert [r["index"] for r in rows] == ["0", "1"]
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3" and rows[1]["temperature.gpu"] == "[N/A]"


def test_compare_accepts_agreement_and_names_each_difference(selftest):
    row = selftest.parse_smi_csv(SMI)[0]
    mib = 1024**2
    good = GpuSample(0, row["uuid"], row["name"], 0.0, memory_used_bytes=1300 * mib,
                     memory_total_bytes=81559 * mib, temperature_c=35, power_w=80.0, power_limit_w=700.0)
    assert selftest.compare(row, good) == []
    bad = GpuSample(0, "GPU-other", row["name"], 0.0, memory_used_bytes=40000 * mib,
                    memory_total_bytes=40000 * mib, temperature_c=60)
    problems = " ".join(selftest.compare(row, bad))
    assert "uuid" in problems and "memory total" in problems and "memory used" in problems
    assert "temperature" in problems


def test_the_power_reading_is_checked_against_nvidia_smi(selftest):
    row, na = selftest.parse_smi_csv(SMI)
    assert (row["power.draw"], row["enforced.power.limit"]) == ("71.52", "700.00")
    ok = GpuSample(0, row["uuid"], row["name"], 0.0, power_w=95.0, power_limit_w=700.0)
    assert selftest.compare_power(row, ok) == []  # 23 W apart: the draw moved between the two reads
    missing = GpuSample(0, row["uuid"], row["name"], 0.0)
    assert [p.split(";")[0] for p in selftest.compare_power(row, missing)] == [
        "no power reading", "no power limit"]
    off = GpuSample(0, row["uuid"], row["name"], 0.0, power_w=150.0, power_limit_w=400.0)
    problems = " ".join(selftest.compare_power(row, off))
    assert "power 150 W" in problems and "power limit 400 W" in problems
    assert selftest.compare_power(na, missing) == []  # a GPU without power readings: nothing to compare


def test_spin_kernel_ptx_is_a_terminated_entry_named_spin(selftest):
    ptx = selftest.SPIN_PTX
    assert ptx.endswith(b"\x00") and b".visible .entry spin(.param .u64 cycles)" in ptx
    assert ptx.count(b"{") == ptx.count(b"}")
