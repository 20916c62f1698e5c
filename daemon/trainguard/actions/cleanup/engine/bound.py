"""The max_delete bound: what one run of a policy may still delete, and the one test of whether
something more fits in it. Every kind and both passes (a plain run's, a need's) ask this class;
the compiled judge (_agescan.c) applies the same test per file, kept equal by tests/test_cleanup_rules.py.

An emergency (a watermark run: the disk is filling) that has deleted nothing yet takes its oldest
unit (a checkpoint directory, a cache entry) whole even when that unit alone is past max_delete:
half a checkpoint is worse than none, and a run that frees nothing while the disk fills is the
failure the bound is there to prevent, not to cause. The units after it go only within the bound,
which that one used up; the run says so (whole_note), and the next cycle goes on.
"""

from __future__ import annotations

from typing import NamedTuple

from trainguard.units import format_bytes, format_ratio

NO_LIMIT = -1


class Bound(NamedTuple):
    """What may still be unlinked: max_files/max_bytes (max_delete) are never exceeded; need_bytes (a
    watermark or size cap) stops the deletion once freed. -1: none."""

    max_files: int = NO_LIMIT
    max_bytes: int = NO_LIMIT
    need_bytes: int = NO_LIMIT

    @classmethod
    def left(cls, limit, files: int, nbytes: int, need: int = NO_LIMIT) -> Bound:
        """What max_delete (a config MaxDelete, None: no bound) allows once files of nbytes went."""
        if limit is None:
            return cls(NO_LIMIT, NO_LIMIT, need)
        return cls(NO_LIMIT if limit.files is None else max(0, limit.files - files),
                   NO_LIMIT if limit.bytes is None else max(0, limit.bytes - nbytes), need)

    def fits(self, files: int, nbytes: int) -> bool:
        """Whether files of nbytes more stay within max_delete (need_bytes aside)."""
        return (self.max_files < 0 or files <= self.max_files) and (self.max_bytes < 0 or nbytes <= self.max_bytes)

    def after(self, files: int, nbytes: int) -> Bound:
        """What is left of this bound once files of nbytes are unlinked."""
        return Bound(*(NO_LIMIT if b < 0 else max(0, b - done) for b, done in zip(self, (files, nbytes, nbytes), strict=True)))


def exceeds(limit, files: int, nbytes: int) -> bool:
    """Whether files of nbytes are more than max_delete (limit, None: no bound) allows one run."""
    return not Bound.left(limit, 0, 0).fits(files, nbytes)



def takes_whole(emergency: bool, done_files: int) -> bool:
    """Whether a unit past what the bound still allows is taken anyway: an emergency's first."""
    return emergency and done_files == 0


def whole_note(whole: tuple[str, int, float], limit, dry_run: bool = False) -> str:
    """What an emergency that took a unit past max_delete says: whole is (the unit, its files, the used
    ratio before it went)."""
    name, files, used = whole
    bound = f"{limit.files:,} files" if limit.files is not None else format_bytes(limit.bytes)
    took = "would take" if dry_run else "took"
    return f"{took} {name} whole ({files:,} files) though max_delete is {bound}: the disk was at {format_ratio(used)}"
