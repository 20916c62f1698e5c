"""GPU health in /metrics: what NVML reports, sampled through the fake at the pynvml boundary,
exported with dcgm-exporter's semantics (absent when the GPU does not support a field)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from trainguard.records import (
    Finding,
    GpuSample,
    NvmlState,
    NvmlStatus,
    Severity,
    Snapshot,
)
from trainguard.sources.gpu import GpuSampler
from trainguard.surfaces.exporter import Readings, ReadingsCollector

from tests.gpu_support import FakeClock, fake_pynvml, gpu_spec
from tests.support.daemon_proc import wait_until

AMPERE = gpu_spec([{"at": 0, "temperature": 83, "power_w": 398.5, "power_limit_w": 400, "throttle": 0x4 | 0x40,
                    "ecc_uncorrected": 2, "ecc_uncorrected_aggregate": 7, "remapped_rows": [5, 1, 1, 0]}],
                  uuid="GPU-ampere",
                  unsupported=["nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"])
VOLTA = gpu_spec([{"at": 0, "retired_pages": [0x100, 0x200, 0x300], "retired_pending": 1}], uuid="GPU-volta",
                 unsupported=["nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors",
                              "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"])


def sample(script, **kwargs):
    clock = FakeClock()
    sampler = GpuSampler(fake_pynvml.FakeNvml(script, clock=clock), clock=clock, host_pid_view=True,
                         xid_events=False, **kwargs)
    clock.advance(10)
    return sampler.sample()


def scrape(readings: Readings) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadingsCollector(lambda: readings))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def series(families, name, **labels) -> dict[tuple, float]:
    """{other labels: value} of the samples named `name` (counters by their _total name)."""
    samples = [s for s in families.get(name.removesuffix("_total"), ()) if s.name == name]
    return {tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("gpu", "uuid") | labels.keys())): s.value
            for s in samples if all(s.labels.get(k) == v for k, v in labels.items())}


def readings_of(reading, findings=()) -> Readings:
    snap = Snapshot(ts=1.0, gpus=reading.gpus, gpu_status=reading.status)
    return Readings(snap, ts=1.0, cycle_duration_s=0.0, findings=tuple(findings))


def test_sampler_reads_ecc_and_row_remapping_and_leaves_out_what_the_gpu_lacks():
    ampere, volta = sample({"gpus": [AMPERE, VOLTA]}).gpus
    assert (ampere.ecc_uncorrected, ampere.ecc_uncorrected_aggregate) == (2, 7)
    assert (ampere.remapped_rows_correctable, ampere.remapped_rows_uncorrectable) == (5, 1)
    assert ampere.row_remap_pending is True and ampere.row_remap_failure is False
    assert ampere.retired_pages is None and ampere.retired_pages_by_cause is None  # NotSupported -> absent
    # The fake puts even-indexed pages under single-bit, odd under double-bit.
    assert volta.retired_pages_by_cause == {"single_bit": 2, "double_bit": 1} and volta.retired_pages == 3
    assert volta.retired_pages_pending is True
    assert volta.ecc_uncorrected is None and volta.remapped_rows_correctable is None
    assert volta.throttle_reasons is None
    assert not ampere.errors and not volta.errors


def test_health_metrics_follow_dcgm_exporter_and_absent_fields_have_no_series():
    families = scrape(readings_of(sample({"gpus": [AMPERE, VOLTA]})))
    assert series(families, "trainguard_gpu_temperature_celsius", gpu="0") == {(): 83}
    assert series(families, "trainguard_gpu_power_watts", gpu="0") == {(): 398.5}
    assert series(families, "trainguard_gpu_power_limit_watts", gpu="0") == {(): 400}
    throttle = series(families, "trainguard_gpu_throttle_reason", gpu="0")
    assert {k[0][1] for k, v in throttle.items() if v == 1} == {"sw_power_cap", "hw_thermal"}
    assert len(throttle) == 9  # every reason NVML names, 0 when inactive: alertable without absent()
    assert series(families, "trainguard_gpu_throttle_reason", gpu="1") == {}
    assert series(families, "trainguard_gpu_ecc_uncorrected_volatile_total", gpu="0") == {(): 2}
    assert series(families, "trainguard_gpu_ecc_uncorrected_aggregate_total", gpu="0") == {(): 7}
    assert series(families, "trainguard_gpu_ecc_uncorrected_volatile_total", gpu="1") == {}
    assert series(families, "trainguard_gpu_remapped_rows_total", gpu="0") == {
        (("cause", "correctable"),): 5, (("cause", "uncorrectable"),): 1}
    assert series(families, "trainguard_gpu_row_remap_pending", gpu="0") == {(): 1}
    assert series(families, "trainguard_gpu_row_remap_failure", gpu="0") == {(): 0}
    assert series(families, "trainguard_gpu_retired_pages_total", gpu="1") == {
        (("cause", "double_bit"),): 1, (("cause", "single_bit"),): 2}
    assert series(families, "trainguard_gpu_retired_pages_pending", gpu="1") == {(): 1}
    assert series(families, "trainguard_gpu_retired_pages_total", gpu="0") == {}


def test_xid_errors_count_per_code_across_samples():
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0}, {"at": 20, "xid": [13, 13]},
                                                    {"at": 40, "xid": [79]}])]}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock, host_pid_view=True, xid_events=True)

    def sample_until(total):
        # The listener thread delivers an event once the fake clock has reached it.
        reading = sampler.sample()
        return reading if sum(reading.gpus[0].xid_counts.values()) >= total else None
    try:
        clock.advance(30)
        first = wait_until(lambda: sample_until(2), 10, what="two XID 13 events")
        clock.advance(20)
        second = wait_until(lambda: sample_until(3), 10, what="the XID 79 event")
    finally:
        sampler.close()
    assert first.gpus[0].xid_counts == {13: 2}
    assert second.gpus[0].xid_counts == {13: 2, 79: 1}  # a counter: earlier events still count
    families = scrape(readings_of(second))
    assert series(families, "trainguard_gpu_xid_errors_total", gpu="0") == {
        (("xid", "13"),): 2, (("xid", "79"),): 1}


def test_nvml_state_has_one_series_per_state_for_alerting_by_name():
    reading = sample({"init_error": "DRIVER_NOT_LOADED", "gpus": [AMPERE]})
    assert reading.status.state is NvmlState.NO_DRIVER
    states = series(scrape(readings_of(reading)), "trainguard_nvml_state")
    assert states[(("state", "no_driver"),)] == 1
    assert states[(("state", "ok"),)] == 0
    assert {k[0][1] for k in states} == {s.value for s in NvmlState}


def test_a_lost_gpu_keeps_its_xid_counter_and_loses_its_current_numbers():
    lost = GpuSample(0, "GPU-x", "A100", 1.0, temperature_c=50.0, lost=True, xid_counts={79: 1})
    snap = Snapshot(ts=1.0, gpus=(lost,), gpu_status=NvmlStatus(NvmlState.LOST, lost=(0,)))
    families = scrape(Readings(snap, ts=1.0, cycle_duration_s=0.0))
    assert series(families, "trainguard_gpu_lost", gpu="0") == {(): 1}
    assert series(families, "trainguard_gpu_xid_errors_total", gpu="0") == {(("xid", "79"),): 1}
    assert series(families, "trainguard_nvml_state", state="lost") == {(): 1}
    assert "trainguard_gpu_temperature_celsius" not in families


def test_findings_are_exported_by_kind_and_object_without_pids_or_paths():
    findings = (
        Finding("fs.next_checkpoint:/data", Severity.WARNING, "next checkpoint will not fit"),
        Finding("gpu.orphan:0:111", Severity.WARNING, "x", labels={"gpu": "0", "pid": "111"}),
        Finding("gpu.orphan:0:222", Severity.WARNING, "x", labels={"gpu": "0", "pid": "222"}),
        Finding("log.match:/var/log/train.log", Severity.WARNING, "x", labels={"file": "/var/log/train.log"}),
    )
    families = scrape(Readings(Snapshot(ts=1.0), ts=1.0, cycle_duration_s=0.0, findings=findings))
    samples = families["trainguard_findings"]
    got = {(s.labels["kind"], s.labels["mountpoint"], s.labels["gpu"]): s.value for s in samples}
    assert got == {("fs.next_checkpoint", "/data", ""): 1, ("gpu.orphan", "", "0"): 2, ("log.match", "", ""): 1}
    for s in samples:
        assert not {"pid", "file", "path"} & set(s.labels)
    assert "trainguard_findings" not in scrape(Readings(Snapshot(ts=1.0), ts=1.0, cycle_duration_s=0.0))


def test_every_family_says_what_it_measures():
    registry = CollectorRegistry(auto_describe=False)
    readings = readings_of(sample({"gpus": [AMPERE, VOLTA]}), [Finding("gpu.xid:0", Severity.CRITICAL, "x")])
    registry.register(ReadingsCollector(lambda: readings))
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert len(families) > 20
    for family in families:
        assert len(family.documentation.split()) >= 2, family.name


def test_memory_health_counters_are_read_once_a_minute_and_follow_a_change():
    """ECC, retired pages and row remapping change over days: read every 60 s, not every cycle."""
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "ecc_uncorrected": 0},
                                                    {"at": 45, "ecc_uncorrected": 3}])]}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock, host_pid_view=True, xid_events=False)
    try:
        seen = []
        for _ in range(8):  # 0 .. 70 s at 10 s
            seen.append(sampler.sample().gpus[0].ecc_uncorrected)
            clock.advance(10)
    finally:
        sampler.close()
    assert nvml.calls["nvmlDeviceGetRemappedRows"] == 2, "read at 0 s and at 60 s"
    assert seen == [0] * 6 + [3, 3], "the change at 45 s is read at the next minute"
