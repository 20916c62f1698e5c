"""What both callbacks decide before a save: go on, save and then stop, or stop without saving."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from trainguard.guard import events
from trainguard.guard.space import Fit, Reserve, list_checkpoints, tree_bytes, will_fit
from trainguard.units import format_bytes

GO, SAVE_THEN_STOP, STOP = "go", "save-then-stop", "stop"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str  # GO, SAVE_THEN_STOP or STOP
    fit: Fit  # for this save
    message: str = ""


def tensor_bytes(objects: Iterable[Any]) -> int:
    """Bytes of the tensors in modules (parameters, buffers) and optimizers (their state), by duck
    typing: what a first checkpoint will take when there is no previous one to go by."""
    total = 0
    for obj in objects:
        if obj is None:
            continue
        tensors: list[Any] = []
        if hasattr(obj, "state_dict") and hasattr(obj, "parameters"):  # a module
            tensors = list(obj.state_dict().values())
        elif hasattr(obj, "state") and isinstance(getattr(obj, "state"), dict):  # an optimizer
            tensors = [v for per_param in obj.state.values() for v in per_param.values()]
        total += sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))
    return total


def estimate(directory: str, patterns: tuple[str, ...], *objects: Any) -> int:
    """The next checkpoint's size: the newest of the framework's own checkpoint names in directory
    (not the final model a run may also keep there), else the tensors' bytes."""
    found = list_checkpoints(directory, patterns) if os.path.isdir(directory) else []
    return tree_bytes(*found[-1]) if found else tensor_bytes(objects)


def decide(directory: str, nbytes: int, reserve: Reserve = None, freed_after_save: int = 0) -> Verdict:
    """Before a save of nbytes into directory: does it fit, and will the one after it fit too
    (after the framework's own rotation frees freed_after_save)? Saving and then stopping while
    there is still room for one good checkpoint beats a save that dies half-written."""
    fit = will_fit(directory, nbytes, reserve)
    if not fit.fits:
        return Verdict(STOP, fit, f"the next checkpoint ({format_bytes(nbytes)}) will not fit: "
                                  f"{format_bytes(fit.avail)} available, reserve {format_bytes(fit.reserve)}; "
                                  "stopping without saving, the last checkpoint is kept")
    left = fit.avail - nbytes + freed_after_save
    if nbytes + fit.reserve > left:
        return Verdict(SAVE_THEN_STOP, fit, f"room for this checkpoint ({format_bytes(nbytes)}) but not the "
                                            f"next ({format_bytes(left)} would be left, reserve "
                                            f"{format_bytes(fit.reserve)}); saving, then stopping")
    return Verdict(GO, fit)


def report_stop(verdict: Verdict, directory: str, source: str, state_dir: str | None) -> None:
    events.report("stopped", directory, state_dir=state_dir, source=source, bytes=verdict.fit.need,
                  avail=verdict.fit.avail, reserve=verdict.fit.reserve, message=verdict.message)
