"""What a crash between the steps of a set-aside (aside.py) leaves: a checkpoint or cache unit under a
private name, quarantine.PREFIX + pid + counter, and ".<the name it had>" when that fitted.

Which entry it holds is no longer known: most often the one judged due, but it may be a file saved
under the judged name between the judgment and the rename (`last.ckpt` saved again), which the check
the crash skipped would have put back. So it is put back first, under the name it carries, never
replacing anything: the kind then judges it like any other entry. When that name is taken again (a
newer save stands there: this is an older version of it) or it carries none (a name too long for
it), nothing can put it back where its owner looks: it is judged as a leftover and goes once outside
grace (its ctime is the rename's) and not in use, as the age kinds judge theirs. A dry run renames
nothing: it says what the leftover would be judged as.
"""

from __future__ import annotations

import logging
import os
from string import hexdigits

from trainguard.actions.cleanup.engine.quarantine import PREFIX, Quarantine

log = logging.getLogger(__name__)


def carried_name(private: str) -> str | None:
    """The name a private name carries (PREFIX + hex pid + "." + hex counter + "." + name), else None."""
    if not private.startswith(PREFIX):
        return None
    pid, _, rest = private[len(PREFIX):].partition(".")
    seq, dot, name = rest.partition(".")
    if not (dot and pid and seq and name) or not all(c in hexdigits for c in pid + seq) or name in (".", ".."):
        return None
    return name


def put_back(dir_fd: int, private: str, path: str, dry_run: bool) -> str | None:
    """Rename private back to the name it carries, never replacing anything: that name, or None when it
    stays (no name, the name taken, or a dry run: then the name only when it is free)."""
    name = carried_name(private)
    if name is None:
        return None
    if dry_run:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            return None
        except FileNotFoundError:
            return name
        except OSError:
            return None
    try:
        Quarantine(dir_fd, atime=False).rename(private, name)
    except OSError as exc:
        log.info("cleanup: %s, left by an interrupted deletion, stays under its private name (%s)", path,
                 os.strerror(exc.errno or 0))
        return None
    log.warning("cleanup: %s was left under a private name by an interrupted deletion; put back as %s",
                path, name)
    return name


def put_back_all(dir_fd: int, dir_path: str, dry_run: bool) -> set[str]:
    """put_back every private name in a directory (a hub repo's snapshots/ or blobs/); in a dry run, the
    private names that would be put back (to be left out of what it lists)."""
    would = set()
    for private in os.listdir(dir_fd):
        if private.startswith(PREFIX) and put_back(dir_fd, private, f"{dir_path}/{private}", dry_run) and dry_run:
            would.add(private)
    return would
