"""[[mirror]]: copy what the trainer writes on local disk to the share, in the background.

The trainer never writes to the (possibly hanging) share itself; trainguard copies new and
changed files there, atomically, in a worker it can kill.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from trainguard.config.base import Strict
from trainguard.config.types import Duration


class Mirror(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    enabled: bool = True
    source: str  # local disk, where the trainer writes
    dest: str  # the share; nothing is ever deleted there
    # Globs relative to source ("**/events.out.tfevents.*", "**/*.pt"); default: everything.
    patterns: list[str] = ["**"]
    exclude: list[str] = []
    every: Duration = Field(60.0, gt=0)
    # A change not copied after this long is the mirror.lag warning.
    lag_warning: Duration = Field(900.0, gt=0)
    # One file's copy that makes no progress for this long is killed and retried later.
    file_timeout: Duration = Field(300.0, gt=0)
    # A metadata operation on the share (mkdir, create, rename, utime, unlink) that makes no progress for this
    # long is killed too: those answer at once from a live share, and waiting `file_timeout` for one only
    # delays the verdict on a hung share.
    meta_timeout: Duration = Field(20.0, gt=0)

    @model_validator(mode="after")
    def _paths(self) -> "Mirror":
        for key in ("source", "dest"):
            value = getattr(self, key)
            if not value.startswith("/") or "\0" in value:
                raise ValueError(f"mirror {self.name!r}: {key} {value!r} must be an absolute path")
        source, dest = os.path.normpath(self.source), os.path.normpath(self.dest)
        if source == dest:
            raise ValueError(f"mirror {self.name!r}: source and dest are the same directory")
        if _inside(dest, source):
            raise ValueError(f"mirror {self.name!r}: dest {dest!r} is inside source {source!r}")
        if _inside(source, dest):
            raise ValueError(f"mirror {self.name!r}: source {source!r} is inside dest {dest!r}")
        if not self.patterns:
            raise ValueError(f"mirror {self.name!r}: patterns is empty (leave it out to copy everything)")
        for key in ("patterns", "exclude"):
            for glob in getattr(self, key):
                if glob.startswith("/") or ".." in glob.split("/") or not glob.strip("/"):
                    raise ValueError(f"mirror {self.name!r}: {key} entry {glob!r} must be a glob relative to source "
                                     "(no leading '/', no '..')")
        return self


def _inside(path: str, parent: str) -> bool:
    return parent == "/" or path.startswith(parent.rstrip("/") + "/")


def _unique_mirror_names(mirrors: list[Any]) -> list[Any]:
    names = [m.name for m in mirrors]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"mirror names must be unique: {', '.join(map(repr, repeated))} repeated")
    return mirrors


Mirrors = Annotated[list[Mirror], AfterValidator(_unique_mirror_names)]


def mirrored_path(mirror: Mirror, local_path: str) -> str | None:
    """Where `local_path` (below mirror.source) lands on the share; None when it is not below source."""
    source = os.path.normpath(mirror.source)
    path = os.path.normpath(local_path)
    if not _inside(path, source):
        return None
    return os.path.join(os.path.normpath(mirror.dest), os.path.relpath(path, source))
