"""GPU families of /metrics: utilisation and memory, the stall state, and GPU health.

Health metrics follow dcgm-exporter's default counters where they overlap, in base
units and with trainguard's `gpu`/`uuid` labels, so a fleet can read both:

    trainguard_gpu_temperature_celsius                 DCGM_FI_DEV_GPU_TEMP
    trainguard_gpu_power_watts                         DCGM_FI_DEV_POWER_USAGE
    trainguard_gpu_power_limit_watts                   DCGM_FI_DEV_POWER_MGMT_LIMIT (the enforced limit)
    trainguard_gpu_throttle_reason{reason}             DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, one 0/1 per bit
    trainguard_gpu_xid_errors_total{xid}               DCGM_FI_DEV_XID_ERRORS (dcgm: last XID; here a count per XID)
    trainguard_gpu_ecc_uncorrected_volatile_total      DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    trainguard_gpu_ecc_uncorrected_aggregate_total     DCGM_FI_DEV_ECC_DBE_AGG_TOTAL
    trainguard_gpu_retired_pages_total{cause}          DCGM_FI_DEV_RETIRED_SBE / _DBE
    trainguard_gpu_retired_pages_pending               DCGM_FI_DEV_RETIRED_PENDING
    trainguard_gpu_remapped_rows_total{cause}          DCGM_FI_DEV_CORRECTABLE_/UNCORRECTABLE_REMAPPED_ROWS
    trainguard_gpu_row_remap_failure                   DCGM_FI_DEV_ROW_REMAP_FAILURE

A field the GPU or driver does not support (NVML NotSupported) has no series, as in
dcgm-exporter: absent, never a made-up zero.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainguard.records import Finding, GpuSample, NvmlState, NvmlStatus
from trainguard.sources.nvml import THROTTLE_REASONS

GPU_LABELS = ("gpu", "uuid")
STALL_KIND = "gpu.stall"
# Whose processes a stalled GPU holds: a small fixed label set, on the stall series only. A stall names at
# most diagnosis.model.MAX_OWNERS (8) distinct owners, so this family has at most 8 series per stalled GPU
# and none when nothing is stalled; no PID, command line or path is ever a label.
OWNER_LABELS = ("namespace", "pod", "container", "slurm_job", "user")


def gpu_stalls(findings: tuple[Finding, ...]) -> dict[str, float]:
    """gpu index (as a label string) -> seconds stalled, from the stall detector's findings."""
    stalls: dict[str, float] = {}
    for f in findings:
        if f.kind == STALL_KIND:
            gpu = f.labels.get("gpu") or f.key.split(":", 1)[1]
            stalls[gpu] = float(f.details.get("stalled_for_s") or 0.0)
    return stalls


def owner_labels(owner: Mapping[str, object]) -> tuple[str, ...]:
    """OWNER_LABELS' values of one owner (sources.owner fields); the container as its 12-hex short id."""
    values = {"namespace": owner.get("namespace"), "pod": owner.get("pod"),
              "container": str(owner.get("container_id") or "")[:12], "slurm_job": owner.get("slurm_job"),
              "user": owner.get("user")}
    return tuple(str(values[name] or "")[:64] for name in OWNER_LABELS)


def stall_owners(findings: tuple[Finding, ...]) -> dict[str, list[tuple[str, ...]]]:
    """gpu index -> the distinct owner label values of its stalled processes (diagnosed stalls only)."""
    out: dict[str, list[tuple[str, ...]]] = {}
    for f in findings:
        if f.kind != STALL_KIND:
            continue
        gpu = f.labels.get("gpu") or f.key.split(":", 1)[1]
        seen = out.setdefault(gpu, [])
        for owner in f.details.get("owners") or ():
            labels = owner_labels(owner) if isinstance(owner, Mapping) else None
            if labels and any(labels) and labels not in seen:
                seen.append(labels)
    return out


def nvml_state(status: NvmlStatus) -> Metric:
    """One 0/1 series per state, like node_exporter's systemd unit state: alertable by name."""
    family = GaugeMetricFamily(
        "trainguard_nvml_state",
        "1 for NVML's current state, 0 for the others: ok, lost (a GPU fell off the bus), no_driver "
        "(kernel module not loaded), mismatch (library and driver differ), no_library, no_permission, off, error",
        labels=("state",))
    for state in NvmlState:
        family.add_metric((state.value,), 1.0 if state == status.state else 0.0)
    return family


def _gauge(name: str, doc: str, *extra: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=GPU_LABELS + extra)


def _counter(name: str, doc: str, *extra: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=GPU_LABELS + extra)


class _Families:
    """The families of one scrape, filled GPU by GPU."""

    def __init__(self) -> None:
        self.util = _gauge("trainguard_gpu_utilization_ratio", "Mean GPU busy ratio since the previous sample (0..1)")
        self.used = _gauge("trainguard_gpu_memory_used_bytes", "GPU memory in use")
        self.total = _gauge("trainguard_gpu_memory_total_bytes", "GPU memory in total")
        self.procs = _gauge("trainguard_gpu_compute_processes", "Compute processes on the GPU")
        self.stalled = _gauge("trainguard_gpu_stalled",
                              "1 while VRAM is held but the GPU does no work (the stall detector)")
        self.stall_s = _gauge("trainguard_gpu_stall_seconds", "How long the current stall has lasted; 0 when none")
        self.stall_owner = _gauge("trainguard_gpu_stall_process_seconds",
                                  "How long the GPU has stalled, per owner of its processes (Kubernetes namespace "
                                  "and pod, container short id, Slurm job, user; empty when unknown); at most 8 "
                                  "series per stalled GPU, absent when none", *OWNER_LABELS)
        self.lost = _gauge("trainguard_gpu_lost", "1 when the driver reports the GPU lost (fallen off the bus)")
        self.temp = _gauge("trainguard_gpu_temperature_celsius", "GPU core temperature (DCGM_FI_DEV_GPU_TEMP)")
        self.power = _gauge("trainguard_gpu_power_watts", "Power draw (DCGM_FI_DEV_POWER_USAGE)")
        self.limit = _gauge("trainguard_gpu_power_limit_watts",
                            "Power limit the driver enforces now (DCGM_FI_DEV_POWER_MGMT_LIMIT)")
        self.throttle = _gauge("trainguard_gpu_throttle_reason",
                               "1 while this clock throttle (clocks event) reason is active, else 0; "
                               "gpu_idle and sw_power_cap are routine, hw_* and *_thermal slow training",
                               "reason")
        self.xid = _counter("trainguard_gpu_xid_errors",
                            "XID errors reported by the driver since trainguard started, by XID code "
                            "(DCGM_FI_DEV_XID_ERRORS holds the last code instead)", "xid")
        self.ecc_vol = _counter("trainguard_gpu_ecc_uncorrected_volatile",
                                "Uncorrected (double-bit) ECC errors since the driver loaded "
                                "(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)")
        self.ecc_agg = _counter("trainguard_gpu_ecc_uncorrected_aggregate",
                                "Uncorrected (double-bit) ECC errors over the GPU's lifetime "
                                "(DCGM_FI_DEV_ECC_DBE_AGG_TOTAL)")
        self.retired = _counter("trainguard_gpu_retired_pages",
                                "Memory pages retired, by cause single_bit / double_bit "
                                "(DCGM_FI_DEV_RETIRED_SBE, _DBE; GPUs before Ampere)", "cause")
        self.retired_pending = _gauge("trainguard_gpu_retired_pages_pending",
                                      "1 when a page retirement waits for a GPU reset (DCGM_FI_DEV_RETIRED_PENDING)")
        self.remapped = _counter("trainguard_gpu_remapped_rows",
                                 "Memory rows remapped, by cause correctable / uncorrectable "
                                 "(DCGM_FI_DEV_*_REMAPPED_ROWS; Ampere and later)", "cause")
        self.remap_pending = _gauge("trainguard_gpu_row_remap_pending",
                                    "1 when a row remap waits for a GPU reset to take effect")
        self.remap_failure = _gauge("trainguard_gpu_row_remap_failure",
                                    "1 when row remapping failed: the GPU needs service (DCGM_FI_DEV_ROW_REMAP_FAILURE)")

    def add_owners(self, g: GpuSample, stall_s: float | None, owners: list[tuple[str, ...]]) -> None:
        if stall_s is None or g.lost:
            return
        for labels in owners:
            self.stall_owner.add_metric((str(g.index), g.uuid) + labels, stall_s)

    def add(self, g: GpuSample, stall_s: float | None) -> None:
        labels = (str(g.index), g.uuid)
        self.lost.add_metric(labels, 1.0 if g.lost else 0.0)
        for xid, count in sorted(g.xid_counts.items()):
            self.xid.add_metric(labels + (str(xid),), count)
        if g.lost:
            return  # no current numbers from a GPU that is gone
        _maybe(self.util, labels, g.util_ratio)
        _maybe(self.used, labels, g.memory_used_bytes)
        _maybe(self.total, labels, g.memory_total_bytes)
        self.procs.add_metric(labels, len(g.processes))
        self.stalled.add_metric(labels, 0.0 if stall_s is None else 1.0)
        self.stall_s.add_metric(labels, stall_s or 0.0)
        self.add_health(labels, g)

    def add_health(self, labels: tuple[str, str], g: GpuSample) -> None:
        _maybe(self.temp, labels, g.temperature_c)
        _maybe(self.power, labels, g.power_w)
        _maybe(self.limit, labels, g.power_limit_w)
        if g.throttle_reasons is not None:
            for reason, bit in THROTTLE_REASONS.items():
                self.throttle.add_metric(labels + (reason,), 1.0 if g.throttle_reasons & bit else 0.0)
        _maybe(self.ecc_vol, labels, g.ecc_uncorrected)
        _maybe(self.ecc_agg, labels, g.ecc_uncorrected_aggregate)
        for cause, pages in sorted((g.retired_pages_by_cause or {}).items()):
            self.retired.add_metric(labels + (cause,), pages)
        _maybe(self.retired_pending, labels, g.retired_pages_pending)
        _maybe(self.remapped, labels + ("correctable",), g.remapped_rows_correctable)
        _maybe(self.remapped, labels + ("uncorrectable",), g.remapped_rows_uncorrectable)
        _maybe(self.remap_pending, labels, g.row_remap_pending)
        _maybe(self.remap_failure, labels, g.row_remap_failure)

    def all(self) -> Iterator[Metric]:
        yield from (value for value in vars(self).values() if value.samples)


def _maybe(family: GaugeMetricFamily | CounterMetricFamily, labels: tuple[str, ...], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def gpu_families(status: NvmlStatus | None, gpus: tuple[GpuSample, ...],
                 findings: tuple[Finding, ...]) -> Iterator[Metric]:
    if status is not None:
        yield nvml_state(status)
    if not gpus:
        return
    families = _Families()
    stalls: Mapping[str, float] = gpu_stalls(findings)
    owners = stall_owners(findings)
    for g in gpus:
        families.add(g, stalls.get(str(g.index)))
        families.add_owners(g, stalls.get(str(g.index)), owners.get(str(g.index), []))
    yield from families.all()
