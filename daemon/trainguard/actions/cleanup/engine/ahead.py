"""Counting ahead: a count of an age policy (a dry run, the count a max_delete guard makes first)
judges a directory's subdirectories on several threads at once, while this thread opens and
lists the next ones.

The walk (walker.scan) goes depth-first, one directory at a time: a count of many small
directories kept one core busy with lstats and, between them, with its own Python work (the
names, the exclude globs). Here, once a directory's own batches are judged, its subdirectories
are each opened as the walk opens them (walker.open_child: the inode listed, same filesystem and
mount), read and checked in place (the hook's "open_dir" and "batch" come as in the walk); the
pass's judge (its candidates, then the rules) runs on `threads` threads, at most `window` in flight
(their fds and names). Each result is then taken, in order, as the walk would take it: its counts, issues
and due entries, between the pass's begin and end of that directory.

A subdirectory with subdirectories of its own, or more names than one read, goes back to the
walk, which counts it as before: what was judged here is dropped. Counting only reads, so the
order directories are counted in changes no total; a pass that deletes never comes here.
"""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Any

from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.engine.bound import Bound

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

Child = tuple[str, int]  # (name, inode listed), as Listing.data holds the subdirectories to enter


class _Job:
    __slots__ = ("index", "child", "sub", "future")

    def __init__(self, index: int, child: Child, sub: walker.Listing, future: Future):
        self.index, self.child, self.sub, self.future = index, child, sub, future


class Ahead:
    """The count threads of one pass (p: an agepass.Pass); close() ends them."""

    def __init__(self, p: Any, threads: int, read_bytes: int):
        self.p, self.threads, self.read_bytes = p, threads, read_bytes  # read_bytes: as the pass reads
        self.window = 4 * threads
        self.pool: ThreadPoolExecutor | None = None  # started on the first directory with subdirectories

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def count(self, lst: walker.Listing, children: list[Child]) -> list[Child]:
        """Count lst's subdirectories (children, last first, as lst.data holds them); returns those the
        walk must still enter, in the same form."""
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor  # a count with subdirectories only

            self.pool = ThreadPoolExecutor(self.threads, "cleanup-count")
        back: list[tuple[int, Child]] = []
        jobs: deque[_Job] = deque()
        try:
            for index, child in enumerate(reversed(children)):
                job = self._start(lst, index, child, back)
                if job is not None:
                    jobs.append(job)
                if len(jobs) >= self.window:
                    self._take(jobs.popleft(), back)
            while jobs:
                self._take(jobs.popleft(), back)
        finally:
            for job in jobs:  # after an error: wait for the judges still running, then close
                job.future.exception()
                os.close(job.sub.fd)
        return [child for _i, child in sorted(back, reverse=True)]

    def _start(self, lst: walker.Listing, index: int, child: Child, back: list) -> _Job | None:
        p = self.p
        root = p.root
        try:
            sub = walker.open_child(lst, *child, dev=root.dev, mnt=root.mnt, hook=p.ctx.tools.hook)
        except OSError as exc:  # reported as the walk reports it, and not entered
            p.problem(walker.WalkProblem.of(lst.prefix + child[0], exc))
            return None
        try:
            names = self._listed(sub, index, child, back)
        except BaseException:
            os.close(sub.fd)
            raise
        if names is None:
            os.close(sub.fd)
            return None
        # the pass's own judge (candidates, then the rules); threads=1: the threads are across directories
        return _Job(index, child, sub, self.pool.submit(p.judge, sub, names, Bound(), threads=1))

    def _listed(self, sub: walker.Listing, index: int, child: Child, back: list) -> list[str] | None:
        """sub read and checked as the walk does before a batch: its names, or None (done, or back)."""
        hook = self.p.ctx.tools.hook
        try:
            names = sub.read(self.read_bytes)
            if names and sub.read(self.read_bytes):
                back.append((index, child))  # a large directory: the walk counts it batch by batch
                return None
            if names and hook is not None:
                hook("batch", sub.path)
            if names and not walker.in_place(sub):  # the last check before the batch is judged
                self._finish(sub, walker.moved(sub), left=True)
                return None
        except OSError as exc:
            self._finish(sub, walker.WalkProblem.of(sub.path, exc))
            return None
        if not names:
            self._finish(sub)  # empty: nothing to count, but the pass sees it (begin, end)
            return None
        return names

    def _take(self, job: _Job, back: list) -> None:
        try:
            got = job.future.result()
            if got.dirs:  # the walk enters it (and counts its names again) to reach its subdirectories
                back.append((job.index, job.child))
                return
            job.sub.data = []
            self.p.begin(job.sub)
            self.p.take(job.sub, got)
            self.p.end(job.sub)
        finally:
            os.close(job.sub.fd)

    def _finish(self, sub: walker.Listing, problem: walker.WalkProblem | None = None, left: bool = False) -> None:
        """A subdirectory done without a judge, as the walk would have seen it (left: it left the root)."""
        p = self.p
        sub.data = False if left else []
        p.begin(sub)
        if problem is not None:
            p.problem(problem)
        p.end(sub)
