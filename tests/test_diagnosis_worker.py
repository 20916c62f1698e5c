"""The diagnosis worker: one job per key, results picked up later, and no thread pile-up on jobs that
never return (a /proc read stuck in the kernel cannot be cancelled)."""

from __future__ import annotations

import threading

from trainguard.diagnosis.worker import BoundedWorker


class Mono:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_one_job_per_key_and_its_result_is_kept():
    release = threading.Event()
    worker = BoundedWorker()
    job = worker.submit("gpu0", lambda: release.wait(10) and "diagnosis", tag=1)
    assert worker.submit("gpu0", lambda: "another") is job  # in flight: the same job, no second thread
    assert not job.wait(0.05)
    release.set()
    assert job.wait(5) and job.result == "diagnosis" and worker.latest("gpu0") is job
    assert worker.submit("gpu0", lambda: "again").wait(5)  # done: a new job may start


def test_stuck_jobs_stop_new_work_until_they_return():
    mono, release = Mono(), threading.Event()
    worker = BoundedWorker(limit=2, stuck_after=30.0, monotonic=mono)
    stuck = [worker.submit(k, lambda: release.wait(10)) for k in ("a", "b")]
    assert worker.submit("c", lambda: "young jobs do not count").wait(5)
    mono.now += 31
    assert worker.stuck() == 2 and worker.submit("d", lambda: "refused") is None
    release.set()
    assert all(j.wait(5) for j in stuck)
    assert worker.submit("d", lambda: "accepted").wait(5)


def test_a_failing_job_is_reported_not_raised():
    job = BoundedWorker().submit("x", lambda: 1 / 0)
    assert job.wait(5) and job.result is None and job.error.startswith("ZeroDivisionError")
