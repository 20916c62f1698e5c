"""What a cleanup run tells people: the run's tallies, the report records, the one-line and
per-policy summaries (with the reasons when nothing goes) and the findings for the alert path."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping

from trainguard.records import Finding, Severity
from trainguard.units import format_bytes

log = logging.getLogger("trainguard.actions.cleanup.runner")

MAX_TOP_DIRS = 4096  # directories tallied for "top directories"; later ones count under "(other)"
QUIET_REASONS = ("grace", "open", "in-use", "busy-run", "excluded", "young", "kept", "not-mirrored")
NOT_SKIPS = ("young", "kept")  # counted for the "why nothing" line, not shown as skips


def printable(path: str) -> str:
    """A path as text any terminal, log or database takes: bytes that are not UTF-8 (kept by
    os.fsdecode as surrogates) are shown escaped, as \\xff; control characters too."""
    if path.isascii() and path.isprintable():
        return path  # the common case, once per deleted file
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        path = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if not path.isprintable():
        path = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
    return path


@dataclass(frozen=True, slots=True)
class Item:
    """One entry deleted (or, in a dry run, that would be)."""

    path: str
    bytes: int
    files: int
    reason: str
    age_s: float
    unit: bool = False


@dataclass(frozen=True, slots=True)
class RootReport:
    root: str
    mount: str
    files: int = 0
    bytes: int = 0
    usage_before: float | None = None  # used ratio when the run started on this root
    usage_after: float | None = None
    note: str = ""  # why nothing happened here, when nothing did


@dataclass(frozen=True, slots=True)
class CleanupReport:
    policy: str
    type: str
    trigger: str  # "manual", "schedule", "watermark"
    dry_run: bool
    started: float
    finished: float
    roots: tuple[RootReport, ...]
    files: int
    bytes: int
    skipped: Mapping[str, int] = field(default_factory=dict)  # reason -> count
    guard: str = ""  # non-empty: max_delete refused a plain run's due entries; none of them was deleted
    bounded: str = ""  # non-empty: max_delete cut short what a watermark or size cap needs (what is left, to raise)
    needed_files: int = 0  # what the watermark or size cap needs, oldest first (past max_delete: estimated)
    needed_bytes: int = 0
    max_delete: str = ""  # the policy's bound, as written for people ("10000 files")
    goal: str = ""  # what the need reaches: "low" (a watermark; goal_value the ratio) or "max_size" (bytes)
    goal_value: float = 0.0
    whole: tuple[str, int, float] | None = None  # an emergency's unit taken past max_delete: (unit, files, used)
    items: tuple[Item, ...] = ()  # the first max_items entries
    planned_files: int = 0
    planned_bytes: int = 0
    dirs_removed: int = 0
    blocked: tuple[str, ...] = ()  # roots this policy cannot delete in, with the reason
    blocked_paths: tuple[tuple[str, str], ...] = ()  # the same as facts: (path, "read-only" or "permission")
    top_dirs: tuple[tuple[str, int, int], ...] = ()  # (directory, bytes, files), most bytes first
    holders: tuple[str, ...] = ()  # "PID 812 (python train.py)" for entries skipped as open
    in_use: tuple[str, ...] = ()  # "backing file of /dev/loop1 (mounted on /mnt/data): /data/img" (kept, in-use)
    uninspected: int = 0  # processes whose open files could not be read (another user's, when not root)

    @property
    def mounts(self) -> list[str]:
        return sorted({r.mount for r in self.roots if r.files}, key=lambda m: -sum(r.bytes for r in self.roots if r.mount == m))


class Tally:
    """Mutable tallies of one policy run: what went, what was skipped and why."""

    def __init__(self, max_items: int, on_item: Callable[[Item], None] | None):
        self.files = 0
        self.bytes = 0
        self.dirs = 0  # empty directories removed
        self.skipped: dict[str, int] = {}
        self.items: list[Item] = []
        self.max_items = max_items
        self.on_item = on_item
        self._logged: dict[str, int] = {}
        self.blocked: list[str] = []
        self.blocked_paths: list[tuple[str, str]] = []
        self.holders: dict[int, str] = {}
        self.in_use: list[str] = []  # the first entries the kernel holds, with what holds them
        self.top: dict[str, list[int]] = {}

    def skip(self, reason: str, path: str = "", detail: str = "") -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if reason in QUIET_REASONS:
            return  # expected, not worth a log line each
        shown = self._logged.get(reason, 0)
        if shown < 5:
            log.warning("cleanup: skipped %s (%s%s)", printable(path), reason, f": {detail}" if detail else "")
        elif shown == 5:
            log.warning("cleanup: more entries skipped for %s; see the run summary", reason)
        self._logged[reason] = shown + 1

    def skip_error(self, path: str, exc: OSError, classify: Callable[[OSError], str]) -> None:
        reason = classify(exc)
        if reason in ("read-only", "permission") and len(self.blocked) < 5:
            self.block(printable(path), reason, f"{printable(path)}: {exc.strerror}")
        self.skip(reason, path, exc.strerror or "")

    def block(self, path: str, kind: str, why: str) -> None:
        """This run cannot delete at path: kind is "read-only" or "permission", why says it in words."""
        self.blocked.append(why)
        self.blocked_paths.append((path, kind))

    def skip_open(self, path: str, holder: int | str | None, describe: Callable[[int | str], str]) -> None:
        """An entry kept because it is in use: open or mapped by a process (holder a PID), or held by
        the kernel (holder says as what: a loop device's backing file, an active swap file)."""
        if isinstance(holder, str):
            if len(self.in_use) < 5:
                self.in_use.append(f"{holder}: {printable(path)}")
            self.skip("in-use", path, holder)
            return
        if holder is not None and holder not in self.holders and len(self.holders) < 5:
            self.holders[holder] = describe(holder)
        self.skip("open", path)

    def add(self, item: Item) -> None:
        self.files += item.files
        self.bytes += item.bytes
        self._top(item.path, item.bytes, item.files)
        if len(self.items) < self.max_items:
            self.items.append(item)
        if self.on_item is not None:
            self.on_item(item)

    def deleted(self, path: str, nbytes: int, files: int, reason: str, age: float, unit: bool) -> None:
        """add() for the age scan's hot path: the Item is built only when someone reads it."""
        if self.on_item is not None or len(self.items) < self.max_items:
            self.add(Item(path, nbytes, files, reason, age, unit))
        else:
            self.files += files
            self.bytes += nbytes
            self._top(path, nbytes, files)

    def deleted_files(self, parent: str, files: list[tuple[str, int, float]], reason: str) -> None:
        """deleted() for single files gone from one directory: (name, bytes, age) each."""
        if self.on_item is not None or len(self.items) < self.max_items:
            for name, nbytes, age in files:
                self.add(Item(f"{parent}/{name}", nbytes, 1, reason, age))
            return
        nbytes = sum(b for _name, b, _age in files)
        self.files += len(files)
        self.bytes += nbytes
        self.top_add(parent, nbytes, len(files))

    def _top(self, path: str, nbytes: int, files: int) -> None:
        self.top_add(path.rstrip("/").rpartition("/")[0], nbytes, files)

    def top_add(self, parent: str, nbytes: int, files: int) -> None:
        """Count entries that went (or would go) from the directory parent."""
        slot = self.top.get(parent)
        if slot is None:
            if len(self.top) >= MAX_TOP_DIRS:
                parent = "(other)"
            slot = self.top.setdefault(parent, [0, 0])
        slot[0] += nbytes
        slot[1] += files

    def top_dirs(self, n: int = 5) -> tuple[tuple[str, int, int], ...]:
        best = sorted(self.top.items(), key=lambda kv: -kv[1][0])[:n]
        return tuple((d, b, f) for d, (b, f) in best)


def describe(report: CleanupReport) -> str:
    """One line for logs and the CLI."""
    verb = "would free" if report.dry_run else "freed"
    if report.guard and not report.files:
        return f"cleanup {report.policy}: stopped, nothing deleted: {report.guard}"
    where = ", ".join(report.mounts) or ", ".join(r.root for r in report.roots) or "no roots"
    line = f"cleanup {report.policy} ({report.trigger}) {verb} {format_bytes(report.bytes)} on {where} ({report.files} files)"
    skipped = sorted((r, n) for r, n in report.skipped.items() if r not in NOT_SKIPS)
    if skipped:
        line += "; skipped " + ", ".join(f"{n} {reason}" for reason, n in skipped)
    if report.blocked:
        line += "; cannot delete: " + "; ".join(report.blocked)
    if report.uninspected:
        line += "; " + uninspected_note(report.uninspected)
    if report.guard:  # a size cap went ahead: its due entries did not
        line += f"; entries due by older_than kept: {report.guard}"
    if report.bounded:
        line += f"; {report.bounded}"
    return line


_REASON_WORDS = {
    "young": "newer than older_than", "grace": "within grace (changed less than grace ago)",
    "open": "open by a process", "not-mirrored": "without an identical copy on the mirror",
    "mount-point": "holding a mount point", "kept": "kept by keep_last/keep_every",
    "unverifiable-open": "possibly open in a process that could not be inspected",
    "in-use": "in use by the kernel (a loop device's backing file, an active swap file)",
    "changed": "replaced or changed between judging and deleting",
}


def uninspected_note(count: int) -> str:
    """Why a run may keep files it cannot prove closed (texts.py says it in the reader's language)."""
    procs = "1 process" if count == 1 else f"{count} processes"
    return f"{procs} of other users could not be inspected (run as root to check their open files)"


def why_nothing(report: CleanupReport) -> str:
    """Why a run deleted nothing, per reason: "12 newer than older_than, 1 open by PID 812 (...)"."""
    parts = []
    for reason, n in sorted(report.skipped.items(), key=lambda kv: -kv[1]):
        words = _REASON_WORDS.get(reason, reason)
        if reason == "open" and report.holders:
            words = "open by " + ", ".join(report.holders)
        parts.append(f"{n} {words}")
    notes = [f"{r.root}: {r.note}" for r in report.roots if r.note]
    return "; ".join(parts + notes) or "no candidates (nothing matched the policy's patterns)"


def summary_lines(report: CleanupReport) -> list[str]:
    """The CLI's per-policy summary: the totals, the top directories, the skips, and when nothing
    goes, why."""
    lines = [describe(report)]
    for root in report.roots:
        line = f"  {root.root}: {root.files} files, {format_bytes(root.bytes)}"
        line += f" on {root.mount}" if root.mount else ""
        lines.append(line + (f" ({root.note})" if root.note else ""))
    if report.top_dirs:
        lines.append("  top directories: " + ", ".join(
            f"{printable(d)} ({format_bytes(b)}, {f} files)" for d, b, f in report.top_dirs))
    if report.dry_run and report.goal == "low" and report.needed_bytes:
        lines.append("  " + watermark_now(report))
    if not report.files and not report.guard:
        lines.append(f"  nothing {'would go' if report.dry_run else 'went'}: {why_nothing(report)}")
    elif report.holders:
        lines.append("  open files kept: " + ", ".join(report.holders))
    lines += [f"  kept: {held}" for held in report.in_use]
    return lines


def watermark_now(report: CleanupReport) -> str:
    """What a watermark run would take now, from a dry run of one (the CLI's summary)."""
    if not report.needed_bytes:
        notes = "; ".join(r.note for r in report.roots if r.note)
        return f"a watermark run now takes nothing{': ' + notes if notes else ''}"
    return (f"a watermark run now takes {report.files} files ({format_bytes(report.bytes)}), oldest first, of about "
            f"{report.needed_files} files ({format_bytes(report.needed_bytes)}) it needs")


def findings_for(report: CleanupReport) -> list[Finding]:
    """What the alert path gets after a run: what was freed, why the guard stopped it, or that it cannot delete."""
    details = {
        "roots": [
            {"root": r.root, "mount": r.mount, "files": r.files, "bytes": r.bytes,
             "usage_before": r.usage_before, "usage_after": r.usage_after, "note": r.note}
            for r in report.roots
        ],
        "trigger": report.trigger,
        "skipped": dict(report.skipped),
        "blocked": list(report.blocked),
        "blocked_paths": [{"path": p, "why": kind} for p, kind in report.blocked_paths],
        "planned_files": report.planned_files,
        "planned_bytes": report.planned_bytes,
        "needed_files": report.needed_files,
        "needed_bytes": report.needed_bytes,
        "uninspected": report.uninspected,
        "unverifiable": report.skipped.get("unverifiable-open", 0),
    }
    labels = {"policy": report.policy}
    out = [_blocked_finding(report, details, labels)] if report.blocked else []
    if details["unverifiable"] and not report.dry_run:
        out.append(Finding(
            key=f"cleanup.unverified:{report.policy}", severity=Severity.WARNING,
            summary=f"cleanup {report.policy} kept {details['unverifiable']} due entries: "
                    f"{uninspected_note(report.uninspected)}",
            details=details, labels=labels, value=float(details["unverifiable"]),
            hint="run trainguard as root (or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE) so that it can "
                 "check every process's open files; trainguard cleanup --dry-run lists what is kept",
        ))
    if report.guard:
        out.append(Finding(
            key=f"cleanup.guard:{report.policy}", severity=Severity.WARNING,
            summary=f"cleanup {report.policy} stopped, nothing deleted: {report.guard}" if not report.files else
                    f"cleanup {report.policy} kept its entries due by older_than: {report.guard}",
            details=details, labels=labels, value=float(report.planned_files),
            hint=f"check it with: trainguard cleanup --dry-run --policy {report.policy}; "
                 "if the list is right, raise max_delete for this policy",
        ))
    if report.bounded and not report.dry_run:
        left = max(0, report.needed_bytes - report.bytes)
        out.append(Finding(
            key=f"cleanup.bounded:{report.policy}", severity=Severity.WARNING,
            summary=f"cleanup {report.policy}: {report.bounded}",
            details={**details, "left_bytes": left, "max_delete": report.max_delete, "goal": report.goal,
                     "goal_value": report.goal_value, **_whole(report.whole)},
            labels={**labels, "mountpoint": report.mounts[0] if report.mounts else ""}, value=float(left),
            hint=f"raise max_delete for policy {report.policy} (or set max_delete = false); "
                 f"trainguard cleanup --dry-run --policy {report.policy} shows what a run takes now",
        ))
    if report.files and not report.dry_run:
        mounts = report.mounts
        out.append(Finding(
            key=f"cleanup.report:{report.policy}", severity=Severity.INFO,
            summary=f"cleanup freed {format_bytes(report.bytes)} on {', '.join(mounts)} "
                    f"({report.policy}: {report.files} files)",
            details=details, labels={**labels, "mountpoint": mounts[0] if mounts else ""},
            value=float(report.bytes),
        ))
    return out


def _blocked_finding(report: CleanupReport, details: dict, labels: dict) -> Finding:
    return Finding(
        key=f"cleanup.blocked:{report.policy}", severity=Severity.WARNING,
        summary=f"cleanup {report.policy} cannot delete: {'; '.join(report.blocked)}",
        details=details, labels=labels, value=float(len(report.blocked)),
        hint="give trainguard write access there: under the shipped systemd unit add the root to "
             "ReadWritePaths= (systemctl edit trainguard, then restart); elsewhere remount it "
             "read-write or fix its permissions",
    )


def _whole(whole: tuple[str, int, float] | None) -> dict:
    """An emergency's unit taken past max_delete, as the finding's facts."""
    if whole is None:
        return {}
    return {"whole_unit": whole[0], "whole_files": whole[1], "whole_used": whole[2]}
