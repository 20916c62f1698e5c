"""Inside the training loop: will the next checkpoint fit, and a save that a full disk cannot tear.

    from trainguard.guard import will_fit, save_checkpoint, CheckpointWontFit
    trainguard.guard.progress(step)  # a heartbeat for the progress watchdog (train.hang)

Cheap to import (no pydantic, apprise, prometheus_client or sqlite3; tests/test_guard.py
checks it) and independent of the daemon: when one runs on this machine, what the guard did
is appended to its state directory and shows up in its alerts and audit log.
"""

from trainguard.guard.events import daemon_state_dir, report
from trainguard.guard.heartbeat import progress
from trainguard.guard.save import Saved, save_checkpoint
from trainguard.guard.space import CheckpointWontFit, Fit, previous_checkpoint, will_fit

__all__ = ["CheckpointWontFit", "Fit", "Saved", "daemon_state_dir", "previous_checkpoint", "progress", "report",
           "save_checkpoint", "will_fit"]
