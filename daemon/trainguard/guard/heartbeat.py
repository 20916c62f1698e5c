"""A heartbeat from inside the training loop, for runs whose progress the daemon cannot see from their files.

    import trainguard.guard
    for step, batch in enumerate(loader):
        ...
        trainguard.guard.progress(step)

At most one line every EVERY seconds goes to the daemon's spool (guardspool): a call between two writes
costs a clock read. With no daemon on this machine nothing is written. It never raises: a heartbeat must
never fail the step that sends it.
"""

from __future__ import annotations

import os
import time

from trainguard.guard.events import daemon_state_dir
from trainguard.guardspool import GUARD_EVENTS_FILE, GuardEvent, append

EVERY = 10.0  # seconds between two spool writes of one process
_state = {"sent": float("-inf"), "count": 0}


def progress(step: int | None = None, *, state_dir: str | None = None) -> None:
    """Tell the daemon this process made progress; `step` defaults to a count of the calls."""
    _state["count"] += 1
    now = time.monotonic()
    if now - _state["sent"] < EVERY:
        return
    _state["sent"] = now
    try:
        where = daemon_state_dir(state_dir)
        if where is None or not os.path.isdir(where):
            return
        event = GuardEvent(ts=time.time(), kind="progress", path="", pid=os.getpid(), source="progress",
                           step=int(step) if step is not None else _state["count"])
        append(os.path.join(where, GUARD_EVENTS_FILE), event)
    except Exception:  # noqa: BLE001 - a heartbeat never fails the training step
        return
