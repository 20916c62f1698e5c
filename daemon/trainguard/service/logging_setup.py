"""Where the daemon's log lines go: stderr (the journal, docker logs), or a size-rotated file.

A container without systemd has no journal: `trainguard run --log-file PATH` writes to a file
that rotates at a size limit (the standard library's RotatingFileHandler, like logrotate's
size rule), so a daemon left running for weeks under nohup cannot fill the disk it watches.
"""

from __future__ import annotations

import logging
import logging.handlers
import os

LOG_FILE_BYTES = 10 * 1024 * 1024  # one file's size before it rotates
LOG_FILE_BACKUPS = 3               # PATH.1 .. PATH.3 are kept


def setup_logging(level: str = "info", log_file: str | None = None, *, max_bytes: int = LOG_FILE_BYTES,
                  backups: int = LOG_FILE_BACKUPS) -> None:
    """One line per event on stderr; under systemd the journal adds time and host itself.
    With log_file: the same lines, timestamped, into a rotating file (OSError if it cannot be opened)."""
    under_journal = bool(os.environ.get("JOURNAL_STREAM")) and not log_file
    fmt = "%(levelname)s %(name)s: %(message)s" if under_journal else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handlers: list[logging.Handler] | None = None
    if log_file:
        directory = os.path.dirname(os.path.abspath(log_file))
        os.makedirs(directory, exist_ok=True)
        handlers = [logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups,
                                                         encoding="utf-8")]
    logging.basicConfig(level=level.upper(), format=fmt, force=True, handlers=handlers)
