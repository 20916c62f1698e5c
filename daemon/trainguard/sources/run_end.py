"""How a training run ended, from the tail of its output (its stdout/stderr files, or the files its
output pipe's reader writes): finished with no error, an error it printed (its last exception, torchrun's
root-cause rank first), or killed (a signal). Only files on a local mount are read: a gone run's output
on a hung share is not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from trainguard.records import MountKind

END_TAIL = 32768  # bytes of a gone run's output read for its error (4 ranks' tracebacks)
END_HOLD = 3600.0  # an ended run is reported this long
_RAISED = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception): \S")  # "RuntimeError: loss is nan"
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)", re.DOTALL)
# torchrun's root cause of a rank ended by a signal, a shell's word for a job it saw killed.
# A shell's job status: "Killed" alone, or "./run.sh: line 3: 4121 Killed    python train.py".
_SHELL_KILLED = r"(?:^|\d\s+)(?:Killed|Terminated)(?:\s{2,}|$)"
_SIGNALLED = re.compile(r"Signal \d+ \(SIG\w+\) received by PID \d+|exitcode\s*:\s*-\d+|" + _SHELL_KILLED)
_FAILED = re.compile(r"ChildFailedError|Segmentation fault|" + _SHELL_KILLED)
LAST_LINES = 5  # without torchrun's report, a shell's "Killed" is among the output's last lines
FINISHED, ERROR, KILLED, UNKNOWN = "finished", "error", "killed", "unknown"


def tail_of(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - END_TAIL))
            return fh.read(END_TAIL).decode("utf-8", "replace")
    except OSError:
        return None


def error_line(text: str) -> str:
    """The line of a run's output tail that says why it failed: its last exception ("RuntimeError: loss
    is nan"), else the launcher's verdict (ChildFailedError) or a kill; "" when none says so."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in lines if _RAISED.search(ln) and "ChildFailedError" not in ln]
    if root := _ROOT_CAUSE.search(text):  # torchrun names the rank that failed first; the others followed it
        raised = [ln for ln in raised if ln.startswith(f"[rank{root.group(1)}]")] or raised
    if raised:
        return raised[-1][:300]
    return next((ln[:300] for ln in reversed(lines) if _FAILED.search(ln)), "")


def how_ended(text: str) -> tuple[str, str]:
    """(how, the line that says so) from an output tail: KILLED when a signal ended it (torchrun's root
    cause first: the other ranks' errors followed it), ERROR with its error line, else FINISHED."""
    root = text[text.find("Root Cause (first observed failure)"):] if "Root Cause (first" in text else ""
    lines = [ln.strip() for ln in (root or text).splitlines() if ln.strip()]
    lines = lines if root else lines[-LAST_LINES:]
    signalled = next((ln[:300] for ln in reversed(lines) if _SIGNALLED.search(ln)), "")
    line = error_line(text)
    if signalled and (root or not _RAISED.search(line)):
        return KILLED, signalled
    if line:
        return (KILLED if _SIGNALLED.search(line) else ERROR), line
    return FINISHED, ""


def ending(outputs: Iterable[str], local: Callable[[str], bool]) -> tuple[str, str]:
    """(how, line) from the first readable output that says something; UNKNOWN when none could be read."""
    read = False
    for path in dict.fromkeys(outputs):
        if not local(path):
            continue
        text = tail_of(path)
        if text is None:
            continue
        read = True
        how, line = how_ended(text)
        if how != FINISHED:
            return how, line
    return (FINISHED, "") if read else (UNKNOWN, "")


def local_paths(kinds: Iterable[tuple[str, MountKind]]) -> Callable[[str], bool]:
    """A predicate: the path is on a local mount (the longest mount point over it is local)."""
    table = sorted(kinds, key=lambda item: len(item[0]), reverse=True)

    def is_local(path: str) -> bool:
        for mp, kind in table:
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                return kind is MountKind.LOCAL
        return True
    return is_local
