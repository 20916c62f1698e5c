"""All the samplers of one config, sampled together into one Snapshot per cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainguard import config as configmod
from trainguard.clock import Clock
from trainguard.records import NvmlState, NvmlStatus, Snapshot
from trainguard.sources.checkpoints import CheckpointSampler
from trainguard.sources.diskstats import DiskstatsSampler
from trainguard.sources.fs import FsSampler
from trainguard.sources.gpu import GpuSampler, load_nvml
from trainguard.sources.logwatch import LogWatcher
from trainguard.sources.run_end import local_paths
from trainguard.sources.runs import RunSampler


def gpu_sampler(cfg: configmod.Config, clock: Clock, nvml=None) -> GpuSampler | None:
    """None when [gpu] is disabled. nvml: the pynvml module (default: the installed one)."""
    if not cfg.gpu.enabled:
        return None
    host_view = {"auto": None, "yes": True, "no": False}[cfg.gpu.host_pid_namespace]
    return GpuSampler(nvml if nvml is not None else load_nvml(), clock=clock.time,
                      proc_root=cfg.general.proc_root, host_pid_view=host_view)


@dataclass
class Samplers:
    fs: FsSampler
    disks: DiskstatsSampler
    gpu: GpuSampler | None = None
    logs: LogWatcher | None = None
    checkpoints: CheckpointSampler | None = None
    runs: RunSampler | None = None  # training runs and their progress marks ([progress] enabled)

    @classmethod
    def from_config(cls, cfg: configmod.Config, clock: Clock, *, nvml=None, follow_logs: bool = False) -> "Samplers":
        fs = cfg.filesystems
        logs = None
        if follow_logs and cfg.logs:
            logs = LogWatcher(cfg.logs, clock=clock.time, proc_root=cfg.general.proc_root).start()
        return cls(
            fs=FsSampler(clock=clock, proc_root=cfg.general.proc_root, paths=fs.paths, exclude=fs.exclude,
                         include_fstypes=fs.include_fstypes, timeout=fs.probe_timeout,
                         wait=min(1.0, cfg.general.interval / 2), host_root=cfg.general.host_root),
            disks=DiskstatsSampler(clock=clock, proc_root=cfg.general.proc_root),
            gpu=gpu_sampler(cfg, clock, nvml),
            logs=logs,
            checkpoints=CheckpointSampler(cfg.cleanup) if cfg.forecast.next_checkpoint else None,
            runs=RunSampler(cfg.general.proc_root) if cfg.progress.enabled else None,
        )

    def sample(self, now: float, heartbeats: Mapping[int, int] | None = None) -> Snapshot:
        """heartbeats: pid -> the last step trainguard.guard.progress() reported (a run's progress too)."""
        filesystems, missing = self.fs.sample()
        if self.gpu is not None:
            reading = self.gpu.sample()
            gpus, gpu_status = reading.gpus, reading.status
        else:
            gpus, gpu_status = (), NvmlStatus(NvmlState.OFF, "GPU monitoring is disabled ([gpu] enabled = false)")
        runs, ended = (), ()
        if self.runs is not None:
            local = local_paths((s.mount.mount_point, s.mount.kind) for s in filesystems)
            logs = self.logs.grown() if self.logs is not None else None
            runs, ended = self.runs.sample(now, gpus, heartbeats, local=local, logs=logs)
        return Snapshot(ts=now, filesystems=tuple(filesystems), disks=tuple(self.disks.sample()),
                        missing_paths=tuple(missing), gpus=gpus, gpu_status=gpu_status,
                        log_matches=self.logs.recent(now) if self.logs is not None else (),
                        checkpoints=self.checkpoints.sample(now, filesystems) if self.checkpoints else (),
                        runs=runs, ended_runs=ended)

    def close(self) -> None:
        self.fs.close()
        if self.gpu is not None:
            self.gpu.close()
        if self.logs is not None:
            self.logs.stop()
