"""Training-run families of /metrics: each run's last progress and its learned timeout, per rank.

    trainguard_run_last_progress_timestamp_seconds   when the rank (else its run) last made progress;
                                                     before the first progress, when the run was first seen
    trainguard_run_progress_timeout_seconds          the run's timeout now (the start-up grace before its
                                                     first progress)

Labels: run (this host's name of it), train_job (the same on every host of one job: the Slurm job,
torchrun's rendezvous id), rank, and the owner labels of the stall series. A fleet rule compares the two
across every host of a job (deploy/prometheus: TrainguardTrainingJobHung). No PID is a label.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from trainguard.surfaces.gpu_metrics import OWNER_LABELS, owner_labels
from trainguard.surfaces.readings import RunProgress

RUN_LABELS = ("run", "train_job", "rank", *OWNER_LABELS)


def run_families(runs: tuple[RunProgress, ...]) -> Iterator[Metric]:
    if not runs:
        return
    last = GaugeMetricFamily("trainguard_run_last_progress_timestamp_seconds",
                             "Unix time the training run's rank last made progress (wrote, moved a file "
                             "position, sent a guard step)", labels=RUN_LABELS)
    timeout = GaugeMetricFamily("trainguard_run_progress_timeout_seconds",
                                "Silence after which the run is called hung: factor x its longest normal gap, "
                                "floored; the start-up grace before its first progress", labels=RUN_LABELS)
    for run in runs:
        seen: set[str] = set()
        for rank, _pid, ts in run.ranks:
            label = "" if rank is None else str(rank)
            if label in seen:
                continue  # ranks without a number: one series for them
            seen.add(label)
            labels = (run.run, run.job, label, *owner_labels(run.owner))
            last.add_metric(labels, ts)
            timeout.add_metric(labels, run.timeout_s)
    yield from (last, timeout)
