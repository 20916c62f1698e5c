"""Telling a running daemon what the guard did: one JSON line appended to its state directory.

The daemon drains guard-events.jsonl each cycle into alerts and the audit log. With no daemon
(no state database where one would be) nothing is written, and a spool nobody drains stops
growing at guardspool.MAX_BYTES; a failure here never fails the save that it reports.
"""

from __future__ import annotations

import os
import time

from trainguard.guardspool import GUARD_EVENTS_FILE, GuardEvent, append

ENV_STATE_DIR = "TRAINGUARD_STATE_DIR"
DAEMON_STATE_DIR = "/var/lib/trainguard"  # general.state_dir's default
STATE_DB = "state.db"  # store.state.DB_NAME: its presence says a daemon keeps state here


def _user_state_dir() -> str:
    """Where a daemon without access to the configured directory keeps its state (store.state)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "trainguard")


def daemon_state_dir(state_dir: str | None = None) -> str | None:
    """The state directory of a daemon on this machine, or None when there is none to tell.

    Explicit argument, then $TRAINGUARD_STATE_DIR, then the daemon config's own override
    ($TRAINGUARD_GENERAL__STATE_DIR), then the default and the per-user fallback.
    """
    if state_dir:
        return state_dir
    for name in (ENV_STATE_DIR, "TRAINGUARD_GENERAL__STATE_DIR"):
        if os.environ.get(name):
            return os.environ[name]
    for candidate in (DAEMON_STATE_DIR, _user_state_dir()):
        if os.path.exists(os.path.join(candidate, STATE_DB)):
            return candidate
    return None


def report(kind: str, path: str, *, state_dir: str | None = None, source: str = "save_checkpoint",
           **fields) -> GuardEvent:
    """Build the event, log it, and append it to the daemon's spool when there is a daemon."""
    import logging  # here, not at import time: the guard stays cheap to import

    log = logging.getLogger("trainguard.guard")
    event = GuardEvent(ts=time.time(), kind=kind, path=path, pid=os.getpid(), source=source, **fields)
    level = logging.INFO if kind == "saved" else logging.WARNING
    log.log(level, "%s %s%s", kind, path, f": {event.message}" if event.message else "")
    where = daemon_state_dir(state_dir)
    if where is not None and os.path.isdir(where):
        problem = append(os.path.join(where, GUARD_EVENTS_FILE), event)
        if problem:
            log.debug("%s: the daemon will not see this event", problem)
    return event
