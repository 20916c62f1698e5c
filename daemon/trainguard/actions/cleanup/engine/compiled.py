"""Whether this installation has the compiled cleanup loop (_agescan, built by setup.py), for
`trainguard status` and `check-config`. Without it cleanup runs the same rules in Python, slower."""

from __future__ import annotations

import importlib
import importlib.util

from trainguard.i18n import N_

MODULE = "trainguard.actions.cleanup.engine._agescan"
ACTIVE = N_("cleanup: compiled loop active")
NOT_BUILT = N_("cleanup: compiled loop not built, Python loop in use (install a C compiler and reinstall)")
UNLOADABLE = N_("cleanup: compiled loop cannot be loaded ({error}), Python loop in use (reinstall trainguard)")


def loop_doc() -> dict:
    """{"compiled": whether cleanup uses the compiled loop, "message": the English line, "error": why not}."""
    try:
        if importlib.util.find_spec(MODULE) is None:
            return {"compiled": False, "message": NOT_BUILT, "error": None}
        importlib.import_module(MODULE)
    except ImportError as exc:  # built for another Python, or a library missing
        return {"compiled": False, "message": UNLOADABLE.format(error=exc), "error": str(exc)}
    return {"compiled": True, "message": ACTIVE, "error": None}


def loop_line(doc: dict, _=lambda s: s) -> str:
    """The status line in the reader's language (gettext function _)."""
    if doc["compiled"]:
        return _(ACTIVE)
    return _(UNLOADABLE).format(error=doc["error"]) if doc["error"] else _(NOT_BUILT)
