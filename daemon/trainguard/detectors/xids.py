"""The XID codes seen most on training hosts: what each means and the first step to take."""

from __future__ import annotations

# Meaning and first step for the XIDs seen most on training hosts (NVIDIA's XID catalogue).
XID_MEANINGS: dict[int, tuple[str, str]] = {
    13: ("graphics engine exception (illegal instruction or out-of-range access in a kernel)",
         "usually an application bug; rerun with CUDA_LAUNCH_BLOCKING=1 / compute-sanitizer"),
    31: ("GPU memory page fault (a kernel accessed an invalid address)",
         "usually an application or framework bug; check the training log for illegal memory access"),
    43: ("GPU stopped processing (the application's channel was reset after a fault)",
         "the job on this GPU is likely dead: restart it"),
    45: ("preemptive cleanup after a previous error (contexts torn down)",
         "follows another XID or a killed process; look at the XID before it"),
    48: ("double-bit ECC error: uncorrectable GPU memory error",
         "drain the GPU and reset it (nvidia-smi -r); replace it if it repeats"),
    63: ("ECC page retirement or row remapping recorded",
         "the GPU retired bad memory; reset it when idle to apply, watch for repeats"),
    64: ("ECC page retirement or row remapping FAILED",
         "the GPU could not retire bad memory: drain it and have it serviced"),
    74: ("NVLink error", "check the NVLink bridge/cabling; reset the GPUs; a repeating error needs service"),
    79: ("GPU has fallen off the bus", "the GPU is gone until the host reboots: drain the node, check power and PCIe"),
    92: ("high single-bit ECC error rate", "the memory is degrading: plan a replacement"),
    94: ("contained ECC error: only the affected application was stopped",
         "restart the job; reset the GPU when convenient"),
    95: ("uncontained ECC error: every application on the GPU is affected",
         "drain the GPU and reset it (nvidia-smi -r) before reuse"),
}
CRITICAL_XIDS = frozenset(XID_MEANINGS)
