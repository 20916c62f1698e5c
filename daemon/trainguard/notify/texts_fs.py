"""What filesystem, disk, cleanup and test findings say to a person (registered in notify.renderers)."""

from __future__ import annotations

from trainguard.i18n import N_, Gettext
from trainguard.notify.renderers import Texts, pct, renders, short_path
from trainguard.records import Finding
from trainguard.units import format_bytes, format_duration, format_ratio


def _mp(f: Finding) -> str:
    return str(f.details.get("mountpoint") or f.labels.get("mountpoint") or "")


# --- filesystems ----------------------------------------------------------------

STEP_FREE = N_("Free space now: remove old checkpoints and caches (trainguard cleanup --dry-run shows "
               "candidates), or move output to a larger volume.")


@renders("fs.usage")
def _fs_usage(f: Finding, _: Gettext) -> Texts:
    d, mp = f.details, _mp(f)
    return Texts(
        fact=_("{mp} {used} full").format(mp=short_path(mp), used=pct(d["used_ratio"])),
        subject=_("{mp} disk space").format(mp=short_path(mp)),
        what=_("{mp} is {used} full: {avail} free of {size}.").format(
            mp=mp, used=format_ratio(d["used_ratio"]), avail=format_bytes(d["avail_bytes"]),
            size=format_bytes(d["size_bytes"])),
        why=_("When it is full, writes fail: checkpoints and logs are lost and training may crash."),
        step=_(STEP_FREE))


@renders("fs.inodes")
def _fs_inodes(f: Finding, _: Gettext) -> Texts:
    d, mp = f.details, _mp(f)
    ratio = f.value if f.value is not None else d["inodes_used"] / max(d["inodes_total"], 1)
    return Texts(
        fact=_("{mp} inodes {used} used").format(mp=short_path(mp), used=pct(ratio)),
        subject=_("{mp} inodes").format(mp=short_path(mp)),
        what=_("{mp} has used {used} of its inodes: {free} of {total} left.").format(
            mp=mp, used=format_ratio(ratio), free=d["inodes_free"], total=d["inodes_total"]),
        why=_("With no inodes left no new file can be created, even with space free."),
        step=_("Too many small files: remove caches, temporary files or extracted datasets."))


@renders("fs.forecast")
def _fs_forecast(f: Finding, _: Gettext) -> Texts:
    d, mp = f.details, _mp(f)
    eta = float(d["eta_seconds"])
    what = _("{mp} is {used} full with {avail} free and fills at {rate}/h: full in about {eta}.").format(
        mp=mp, used=format_ratio(d["used_ratio"]), avail=format_bytes(d["avail_bytes"]),
        rate=format_bytes(float(d["fill_bytes_per_second"]) * 3600), eta=format_duration(eta))
    return Texts(
        fact=_("{mp} {used} — full in {eta}").format(mp=short_path(mp), used=pct(d["used_ratio"]),
                                                     eta=format_duration(eta)),
        subject=_("{mp} disk space").format(mp=short_path(mp)),
        what=what,
        why=_cleanup_why(d, _) or _("The trend of the last {span} says it runs out; then writes fail and training "
                                    "may crash.").format(span=format_duration(d.get("fitted_span_seconds"))),
        step=_(STEP_FREE))


def _cleanup_why(d: dict, _: Gettext) -> str:
    """A saw-tooth: when its next cleanup is expected, and what happens if it does not come."""
    if not d.get("cleanup_every_seconds"):
        return ""
    every, frees = format_duration(d["cleanup_every_seconds"]), format_bytes(d["cleanup_frees_bytes"])
    if d.get("cleanup_missed"):
        return _("A cleanup freed {frees} every {every}; the last one is overdue, so none is counted on: "
                 "without it the disk is full in about {eta}.").format(
            frees=frees, every=every, eta=format_duration(d["eta_seconds"]))
    return _("A cleanup frees {frees} every {every}, but the disk is lower after each one. The next is expected "
             "in about {next}; if it does not come, the disk is full in about {without}.").format(
        frees=frees, every=every, next=format_duration(d["next_cleanup_in_seconds"]),
        without=format_duration(d["eta_without_cleanup_seconds"]))


@renders("fs.unresponsive")
def _fs_unresponsive(f: Finding, _: Gettext) -> Texts:
    d, mp = f.details, _mp(f)
    stuck = format_duration(d["stuck_seconds"])
    return Texts(
        fact=_("{mp} hung for {stuck}").format(mp=short_path(mp), stuck=stuck),
        subject=_("{mp} responsiveness").format(mp=short_path(mp)),
        what=_("{mp} ({fstype}, {source}) has not answered statfs for {stuck}.").format(
            mp=mp, fstype=d["fstype"], source=d["source"], stuck=stuck),
        why=_("I/O to this mount hangs: processes writing to it (checkpoints, logs) stall too."),
        step=_("Check the network or FUSE daemon behind it; keep training logs and checkpoints on local disk "
               "and sync them in the background."))


@renders("fs.error")
def _fs_error(f: Finding, _: Gettext) -> Texts:
    mp = _mp(f)
    return Texts(
        fact=_("{mp} unreadable").format(mp=short_path(mp)),
        subject=_("{mp} usage").format(mp=short_path(mp)),
        what=_("Cannot read the usage of {mp}: {error}.").format(mp=mp, error=f.details["error"]),
        why=_("Its disk space is not watched while this lasts."),
        step=_("Check the mount (permissions, a stale network handle) with: df {mp}").format(mp=mp))


@renders("fs.path_missing")
def _fs_path_missing(f: Finding, _: Gettext) -> Texts:
    path = str(f.details["path"])
    return Texts(
        fact=_("{path} missing").format(path=short_path(path)),
        subject=_("watched path {path}").format(path=short_path(path)),
        what=_("The watched path {path} does not exist.").format(path=path),
        why=_("The filesystem it should be on is not watched."),
        step=_("Create it, or fix filesystems.paths in the config."))


@renders("disk.saturated")
def _disk_saturated(f: Finding, _: Gettext) -> Texts:
    d = f.details
    mounts = ", ".join(d.get("mountpoints") or ())
    return Texts(
        fact=_("disk {device} I/O {busy} busy").format(device=d["device"], busy=pct(d["util_ratio"])),
        subject=_("disk {device} I/O").format(device=d["device"]),
        what=_("Disk {device} ({mounts}) is {busy} busy, writing {write}/s.").format(
            device=d["device"], mounts=mounts, busy=format_ratio(d["util_ratio"]),
            write=format_bytes(d["write_bytes_per_s"])),
        why=_("The disk is the bottleneck: data loading and checkpoints wait for it."),
        step=_("Check which process writes (iotop, trainguard diagnose); move data loading or checkpoints "
               "to a faster volume."))


# --- cleanup and the test alert -------------------------------------------------------

@renders("cleanup.guard")
def _cleanup_guard(f: Finding, _: Gettext) -> Texts:
    policy, d = f.labels["policy"], f.details
    if d.get("planned_files") is not None:  # what a size cap needed went ahead: not counted here
        why = _("It would delete {files} files ({size}), more than this policy's max_delete allows.").format(
            files=d["planned_files"] - (d.get("needed_files") or 0),
            size=format_bytes((d.get("planned_bytes") or 0) - (d.get("needed_bytes") or 0)))
    else:  # a finding from before the facts were kept: the guard's own words
        why = f.summary.split(": ", 1)[1] if ": " in f.summary else ""
    went = sum(int(r.get("files") or 0) for r in d.get("roots") or [])
    return Texts(
        fact=_("cleanup {policy} stopped").format(policy=policy),
        subject=_("cleanup {policy}").format(policy=policy),
        what=(_("Cleanup {policy} kept the entries due by older_than, deleting only what max_size "
                "needed.") if went else _("Cleanup {policy} stopped before deleting anything.")).format(policy=policy),
        why=why,
        step=_("Check it with: trainguard cleanup --dry-run --policy {policy}; if the list is right, "
               "raise max_delete for this policy.").format(policy=policy))


@renders("cleanup.bounded")
def _cleanup_bounded(f: Finding, _: Gettext) -> Texts:
    policy, d = f.labels["policy"], f.details
    roots = d.get("roots") or []
    files, freed = sum(int(r.get("files") or 0) for r in roots), sum(int(r.get("bytes") or 0) for r in roots)
    if d.get("goal") == "low":
        goal = _("the {low} watermark").format(low=format_ratio(float(d.get("goal_value") or 0)))
    else:
        goal = _("max_size {size}").format(size=format_bytes(int(d.get("goal_value") or 0)))
    if d.get("whole_unit"):
        return _cleanup_whole(f, _, goal)
    return Texts(
        fact=_("cleanup {policy} stopped at max_delete").format(policy=policy),
        subject=_("cleanup {policy}").format(policy=policy),
        what=_("Cleanup {policy} deleted {files} files ({freed}), oldest first, and stopped at max_delete "
               "({limit}): {left} more must go to reach {goal}, about {needed} files in all.").format(
            policy=policy, files=files, freed=format_bytes(freed), limit=d.get("max_delete") or "-",
            left=format_bytes(int(d.get("left_bytes") or 0)), goal=goal, needed=d.get("needed_files") or 0),
        why=_("One run never deletes more than max_delete; the next run goes on from the oldest files left."),
        step=_("If these files may go, raise max_delete for this policy (or set max_delete = false); "
               "trainguard cleanup --dry-run --policy {policy} shows what a run takes now.").format(policy=policy))


def _cleanup_whole(f: Finding, _: Gettext, goal: str) -> Texts:
    """An emergency took its oldest checkpoint whole, though that alone is past max_delete."""
    policy, d = f.labels["policy"], f.details
    return Texts(
        fact=_("cleanup {policy} took {unit} whole ({files} files) though max_delete is {limit}").format(
            policy=policy, unit=d["whole_unit"], files=f"{int(d.get('whole_files') or 0):,}",
            limit=d.get("max_delete") or "-"),
        subject=_("cleanup {policy}").format(policy=policy),
        what=_("The disk was at {used}: cleanup {policy} took its oldest checkpoint, {unit}, whole; "
               "{left} more must go to reach {goal}.").format(
            used=format_ratio(float(d.get("whole_used") or 0)), policy=policy, unit=d["whole_unit"],
            left=format_bytes(int(d.get("left_bytes") or 0)), goal=goal),
        why=_("Half a checkpoint is worse than none, and the disk was filling: one checkpoint goes whole even past "
              "max_delete; the next runs go on one at a time."),
        step=_("If checkpoints this large are normal here, raise max_delete for this policy; "
               "trainguard cleanup --dry-run --policy {policy} shows what a run takes now.").format(policy=policy))


@renders("cleanup.report")
def _cleanup_report(f: Finding, _: Gettext) -> Texts:
    roots = f.details.get("roots") or []
    freed = sum(int(r.get("bytes") or 0) for r in roots)
    files = sum(int(r.get("files") or 0) for r in roots)
    mounts = ", ".join(sorted({str(r.get("mount")) for r in roots if r.get("mount")}))
    uninspected = int(f.details.get("uninspected") or 0)
    unseen = (" " + _("{count} processes of other users could not be inspected; {kept} due entries they could "
                      "have open were kept.").format(count=uninspected, kept=f.details.get("unverifiable") or 0)
              if uninspected else "")
    return Texts(
        fact=_("cleanup freed {freed}").format(freed=format_bytes(freed)),
        subject=_("cleanup {policy}").format(policy=f.labels["policy"]),
        what=_("Cleanup {policy} deleted {files} files and freed {freed} on {mounts}.").format(
            policy=f.labels["policy"], files=files, freed=format_bytes(freed), mounts=mounts or "-") + unseen,
        why=_("Trigger: {trigger}.").format(trigger=f.details.get("trigger") or "-"))


@renders("trainguard.test")
def _test_alert(f: Finding, _: Gettext) -> Texts:
    host = f.details.get("host", "")
    return Texts(
        fact=_("test alert"),
        subject=_("test alert"),
        what=_("A test alert from trainguard on {host}: if you can read this, delivery works.").format(host=host),
        step=_("Nothing to do; real alerts look like this one."))
