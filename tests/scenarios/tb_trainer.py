"""A training-like process for the "silent hang on shared storage" scenario (plain Python, no ML libraries).

It is built like a PyTorch job using TensorBoard's ``SummaryWriter``:

- the main thread "computes" a step, touches a heartbeat file (the fake NVML reads
  its freshness as GPU utilisation: busy while it is fresh, 0 % once it is stale)
  and hands a scalar summary to the writer through a bounded queue, as
  ``add_scalar`` does;
- a writer thread named ``EventFileWriter`` (kernel thread name too, so
  ``/proc/<pid>/task/*/comm`` shows it) takes events off the queue and appends
  them to ``events.out.tfevents.<time>.<host>`` in the log directory, flushing
  each one.

When the log directory sits on a mount whose writes hang, the writer blocks in
the kernel, the queue fills, and the main thread blocks in ``put`` — the process
is alive, holds its GPU memory and does nothing: the field report's stall.  When
the writes go through again, everything resumes by itself.

    python tb_trainer.py --logdir /mnt/share/runs/exp1 --heartbeat /tmp/hb --status /tmp/status.json

Runs until SIGTERM/SIGINT (or ``--steps``).  ``--status`` is rewritten (on local
disk) after every step with the step count and the writer's progress, so a test
can see where it is without touching the possibly hung mount.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

WRITER_THREAD_NAME = "EventFileWriter"  # 15 characters: fits the kernel's comm field
_PR_SET_NAME = 15


def set_kernel_thread_name(name: str) -> None:
    """Name the calling thread in /proc/<pid>/task/<tid>/comm (Python < 3.14 does not do it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the Python-level name still identifies the thread


def tf_record(data: bytes) -> bytes:
    """One TFRecord-framed event: length, length checksum, payload, payload checksum."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", zlib.crc32(header)) + data + struct.pack("<I", zlib.crc32(data))


class EventFileWriter(threading.Thread):
    """Appends queued events to one tfevents file, flushing each (like flush_secs=0)."""

    def __init__(self, logdir: Path, events: queue.Queue) -> None:
        super().__init__(name=WRITER_THREAD_NAME, daemon=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.events = events
        self.written = 0
        self.error: str | None = None

    def run(self) -> None:
        set_kernel_thread_name(WRITER_THREAD_NAME)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                while (event := self.events.get()) is not None:
                    os.write(fd, tf_record(event))
                    self.written += 1
            finally:
                os.close(fd)
        except OSError as exc:  # like TensorBoard's thread: it dies with a traceback, training goes on
            self.error = f"{type(exc).__name__}: {exc}"
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--logdir", type=Path, required=True, help="TensorBoard log directory")
    parser.add_argument("--heartbeat", type=Path, required=True, help="touched after every computed step")
    parser.add_argument("--status", type=Path, required=True, help="JSON progress file, on local disk")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--max-queue", type=int, default=10, help="SummaryWriter's max_queue")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps; 0: until SIGTERM")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    args.logdir.mkdir(parents=True, exist_ok=True)
    events: queue.Queue = queue.Queue(maxsize=args.max_queue)
    writer = EventFileWriter(args.logdir, events)
    writer.start()
    step = 0
    while not stop.is_set() and (args.steps == 0 or step < args.steps):
        time.sleep(args.step_seconds)  # "compute" on the GPU
        step += 1
        args.heartbeat.touch()
        summary = json.dumps({"tag": "loss", "step": step, "value": 1.0 / step}).encode()
        while not stop.is_set():  # add_scalar: blocks while the writer's queue is full
            try:
                events.put(summary, timeout=0.2)
                break
            except queue.Full:
                continue
        tmp = args.status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "step": step, "written": writer.written,
                                   "event_file": str(writer.path), "writer_error": writer.error}))
        os.replace(tmp, args.status)
    # Leave like SummaryWriter.close(): the writer drains the queue unless it is stuck.
    try:
        events.put(None, timeout=1.0)
    except queue.Full:
        pass
    writer.join(timeout=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
