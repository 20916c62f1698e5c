"""Texts for what trainguard itself does and keeps: cleanup that cannot delete, the next checkpoint that
will not fit, mirrors that lag, its own state that cannot be written, and what the in-trainer guard
did at save time (see notify/texts.py)."""

from __future__ import annotations

from trainguard.i18n import N_, Gettext
from trainguard.notify.renderers import Texts, renders, short_path
from trainguard.records import Finding
from trainguard.units import format_bytes, format_duration, format_ratio

BLOCKED_WHY = {"read-only": N_("{path} is mounted read-only here"),
               "permission": N_("{path} is not writable for trainguard's user")}


@renders("cleanup.blocked")
def _cleanup_blocked(f: Finding, _: Gettext) -> Texts:
    policy = f.labels["policy"]
    facts = f.details.get("blocked_paths")
    if facts:
        reasons = [_(BLOCKED_WHY.get(b["why"], BLOCKED_WHY["permission"])).format(path=b["path"]) for b in facts]
    else:  # a finding from before the facts were kept: the run's own words
        reasons = f.details.get("blocked") or [f.summary.split(": ", 1)[-1]]
    return Texts(
        fact=_("cleanup {policy} cannot delete").format(policy=policy),
        subject=_("cleanup {policy} write access").format(policy=policy),
        what=_("Cleanup {policy} cannot delete under its roots: {reasons}.").format(
            policy=policy, reasons=_("; ").join(reasons)),
        why=_("The roots are read-only for trainguard, so this policy frees no space when the disk fills."),
        step=_("Give trainguard write access there: under the shipped systemd unit add the root to "
               "ReadWritePaths= (systemctl edit trainguard, then restart); elsewhere remount it read-write "
               "or fix its permissions."))


@renders("cleanup.unverified")
def _cleanup_unverified(f: Finding, _: Gettext) -> Texts:
    policy, d = f.labels["policy"], f.details
    return Texts(
        fact=_("cleanup {policy} kept {kept} entries").format(policy=policy, kept=d["unverifiable"]),
        subject=_("cleanup {policy} open-file check").format(policy=policy),
        what=_("Cleanup {policy} kept {kept} due entries: {count} processes of other users could not be "
               "inspected, and they could have those files open.").format(
            policy=policy, kept=d["unverifiable"], count=d["uninspected"]),
        why=_("Without root, trainguard cannot see other users' open files, so it does not delete what they "
              "may be using: this policy frees less space."),
        step=_("Run trainguard as root (or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE) to check their open "
               "files; trainguard cleanup --dry-run lists what is kept."))


@renders("fs.next_checkpoint")
def _fs_next_checkpoint(f: Finding, _: Gettext) -> Texts:
    d, mp = f.details, str(f.details.get("mountpoint") or f.labels.get("mountpoint") or "")
    ckpt = format_bytes(d["checkpoint_bytes"])
    free_then = format_bytes(max(d["avail_at_next_bytes"], 0))
    if d.get("next_write_in_seconds") is not None:
        eta = format_duration(d["next_write_in_seconds"])
        fact = _("{mp} no room for next checkpoint ({eta})").format(mp=short_path(mp, 20), eta=eta)
        what = _("The next checkpoint on {mp} (about {ckpt}, due in about {eta}) will not fit: {free} free "
                 "then, {need} needed.").format(mp=mp, ckpt=ckpt, eta=eta, free=free_then,
                                                 need=format_bytes(d["needed_bytes"]))
    else:
        fact = _("{mp} no room for next checkpoint").format(mp=short_path(mp, 20))
        what = _("The next checkpoint on {mp} (about {ckpt}) will not fit: {free} free, {need} needed.").format(
            mp=mp, ckpt=ckpt, free=free_then, need=format_bytes(d["needed_bytes"]))
    used = _(" The disk is {used} full.").format(used=format_ratio(d["used_ratio"])) if d.get("used_ratio") else ""
    return Texts(
        fact=fact, subject=_("{mp} next checkpoint").format(mp=short_path(mp)), what=what + used,
        why=_("A save that does not fit fails halfway: the checkpoint is lost and the trainer may crash."),
        step=_("Free space before the next save (trainguard cleanup --dry-run shows candidates), lower "
               "keep_last, or save to a larger volume."))


MIRROR_CAUSES = {
    "unresponsive": N_("The share does not answer."),
    "full": N_("The share is full."),
    "permission": N_("trainguard may not write to the share."),
    "changing": N_("A file keeps changing while it is copied."),
    "error": N_("Copying fails."),
    "copying": N_("It is still copying."),
}
MIRROR_STEPS = {
    "unresponsive": N_("Check the share's mount (network, FUSE daemon). Training is safe on local disk, and the "
                       "copy resumes by itself when the share answers."),
    "full": N_("Free space or quota on the share; until then the copies stay on local disk only."),
    "permission": N_("Make the destination writable for trainguard's user (or fix a read-only mount)."),
    "changing": N_("Write that file under a temporary name and rename it when it is complete."),
    "error": N_("Run trainguard mirror to see the failing file."),
    "copying": N_("A large first copy takes time; trainguard status shows its progress."),
}


@renders("mirror.lag")
def _mirror_lag(f: Finding, _: Gettext) -> Texts:
    d = f.details
    name, lag = d["mirror"], format_duration(d["lag_s"])
    kind = d.get("reason_kind") if d.get("reason_kind") in MIRROR_CAUSES else "copying"
    cause = _(MIRROR_CAUSES[kind])
    if kind == "error" and d.get("reason"):
        cause = _("Copying fails: {reason}.").format(reason=d["reason"])
    if d.get("stuck_pid"):
        cause += " " + _("Its copier (PID {pid}) is stuck in the kernel in {op} {path} and ends only when the share "
                         "answers; trainguard starts no other.").format(pid=d["stuck_pid"], op=d.get("stuck_op") or "?",
                                                                       path=short_path(d.get("stuck_path") or "", 40))
    return Texts(
        fact=_("mirror {name} {lag} behind").format(name=name, lag=lag),
        subject=_("mirror {name}").format(name=name),
        what=_("Changes on local disk have not reached {dest} for {lag}: {files} files ({size}) waiting.").format(
            dest=d["dest"], lag=lag, files=d.get("pending_files") or 0, size=format_bytes(d.get("pending_bytes") or 0)),
        why=_("{cause} Until they arrive, the share lacks the newest checkpoints and logs.").format(cause=cause),
        step=_(MIRROR_STEPS[kind]))


@renders("state.unwritable")
def _state_unwritable(f: Finding, _: Gettext) -> Texts:
    d = f.details
    state_dir = str(d["state_dir"])
    return Texts(
        fact=_("cannot write state in {dir}").format(dir=short_path(state_dir, 30)),
        subject=_("trainguard state in {dir}").format(dir=short_path(state_dir)),
        what=_("trainguard cannot write its state ({parts}) in {dir}: {error}.").format(
            parts=", ".join(d.get("parts") or ()), dir=state_dir, error=d["error"]),
        why=_("Until then history and undelivered alerts are kept in memory only: a restart loses them."),
        step=_("Free space on the filesystem holding {dir}, or move general.state_dir to another disk.").format(
            dir=state_dir))


# What the in-trainer guard did at save time (actions/guard_inbox.py): fact, subject, what, why, step.
GUARD_TEXTS = {
    "guard.wont-fit": (
        N_("{mp_short} checkpoint won't fit, save refused"), N_("checkpoint saves on {mp_short}"),
        N_("The checkpoint save was refused before writing: {path} needs about {size}, {avail} free on {mp}."),
        N_("A save that does not fit fails halfway and can take the previous checkpoint with it."),
        N_("Free space on that filesystem (trainguard cleanup --dry-run shows candidates), lower keep_last, "
           "or give the save a fallback directory.")),
    "guard.stopped": (
        N_("{mp_short} full, training stopped after saving"), N_("training run on {mp_short}"),
        N_("The training run (PID {pid}) saved {path} and stopped for disk space: {avail} free on {mp}."),
        N_("The next save would not have fit; stopping cleanly keeps the last checkpoint whole."),
        N_("Free space and resume from the last checkpoint.")),
    "guard.fallback": (
        N_("checkpoint saved to fallback dir"), N_("checkpoint saves on the primary directory"),
        N_("The checkpoint was saved in the fallback directory: {path}."),
        N_("The primary directory did not have room for it."),
        N_("Free space on the primary directory (trainguard cleanup --dry-run shows candidates).")),
}


@renders(*GUARD_TEXTS)
def _guard_event(f: Finding, _: Gettext) -> Texts:
    d, mount = f.details, str(f.labels.get("mountpoint") or "")
    facts = {"path": str(f.labels.get("path") or f.key.split(":", 1)[-1]), "mp": mount,
             "mp_short": short_path(mount, 24), "pid": d.get("pid", "-"), "size": format_bytes(d.get("bytes") or 0),
             "avail": format_bytes(d["avail"]) if d.get("avail") is not None else "-"}
    fact, subject, what, why, step = (_(text).format(**facts) for text in GUARD_TEXTS[f.kind])
    return Texts(fact=fact, subject=subject, what=what, why=why, step=step)
