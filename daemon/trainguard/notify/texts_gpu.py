"""Texts for GPU and training-log findings (see notify/texts.py)."""

from __future__ import annotations

from trainguard.i18n import N_, Gettext, tr
from trainguard.notify.renderers import Texts, plain, renders, short_path
from trainguard.records import Finding
from trainguard.redact import scrub
from trainguard.units import format_bytes, format_duration, format_ratio

# (The detector and diagnosis modules are imported where used: composing a message stays light.)
# The log patterns whose next steps are translated (the detector's hint for each, in English).
LOG_HINT_PATTERNS = ("No space left on device", "tfevents", "CUDA out of memory", "NCCL", "")
XID_UNKNOWN = (N_("see NVIDIA's XID catalogue"), N_("check dmesg for NVRM lines"))


def _gpu(f: Finding) -> str:
    return str(f.details.get("gpu", f.labels.get("gpu", "?")))


def _stall_step(f: Finding, gpu: str, _: Gettext) -> str:
    """The remedy from the diagnosis facts; without them (an alert queued by an older version) the
    detector's English hint, after the generic step when it has no translation."""
    from trainguard.diagnosis.words import remedy_text

    facts = (f.details.get("diagnosis") or {}).get("facts")
    if facts:
        return remedy_text(facts, _)
    hint = plain(f.hint)
    generic = _("Run trainguard diagnose {gpu} to see what its processes are blocked on.").format(gpu=gpu)
    step = _(hint) if hint and "diagnose" not in hint else generic
    if step == hint and _ is not tr("en"):
        step = f"{generic} {hint}"
    return step


def _stall_why(f: Finding, _: Gettext) -> str:
    from trainguard.diagnosis.words import verdict_text

    facts = (f.details.get("diagnosis") or {}).get("facts")
    verdict = verdict_text(facts, _) if facts else f.details.get("verdict")
    if not verdict:
        return _("The training job holds the GPU but does no work: it is probably stuck on I/O or a dead peer.")
    return _("Diagnosis: {verdict}.").format(verdict=plain(str(verdict)))


def owners_sentence(f: Finding, _: Gettext) -> str:
    """" Owner: pod ml/train-7f (user alice, Slurm job 4242)." from the finding's owners; "" when unknown."""
    from trainguard.diagnosis.words import owner_text

    owners = [o for o in f.details.get("owners") or () if isinstance(o, dict) and o]
    if not owners:
        return ""
    names = [owner_text(o, _) for o in owners[:3]]
    more = _(" and {n} more").format(n=len(owners) - 3) if len(owners) > 3 else ""
    return (_(" Owner: {owner}.") if len(names) == 1 else _(" Owners: {owners}.")).format(
        owner=names[0], owners=_("; ").join(names) + more)


@renders("gpu.stall")
def _gpu_stall(f: Finding, _: Gettext) -> Texts:
    d, gpu = f.details, _gpu(f)
    stalled = format_duration(d["stalled_for_s"])
    name = f" ({d['name']})" if d.get("name") else ""
    return Texts(
        fact=_("GPU {gpu} stalled for {stalled}").format(gpu=gpu, stalled=stalled),
        subject=_("GPU {gpu} stall").format(gpu=gpu),
        what=_("GPU {gpu}{name} holds {used} of {total} VRAM but has been {util} busy for {stalled}.").format(
            gpu=gpu, name=name, used=format_bytes(d["memory_used_bytes"]), total=format_bytes(d["memory_total_bytes"]),
            util=format_ratio(d["util_mean_ratio"]), stalled=stalled) + owners_sentence(f, _),
        why=_stall_why(f, _),
        step=_stall_step(f, gpu, _))


@renders("gpu.orphan")
def _gpu_orphan(f: Finding, _: Gettext) -> Texts:
    d, gpu = f.details, _gpu(f)
    held = format_bytes(d["used_memory_bytes"]) if d.get("used_memory_bytes") is not None else _("memory")
    zombie = d.get("state") == "Z"
    return Texts(
        fact=_("GPU {gpu} {held} held by dead PID {pid}").format(gpu=gpu, held=held, pid=d["host_pid"]),
        subject=_("GPU {gpu} memory of PID {pid}").format(gpu=gpu, pid=d["host_pid"]),
        what=(_("GPU {gpu}: {held} held by PID {pid}, a zombie (exited, its parent has not reaped it).") if zombie
              else _("GPU {gpu}: {held} held by PID {pid}, which no longer exists.")).format(
            gpu=gpu, held=held, pid=d["host_pid"]),
        why=_("That memory is not available to new jobs."),
        step=(_("Restart or signal the zombie's parent process so it reaps it; the memory is freed then.") if zombie
              else _("The driver has not released the memory of an exited process; if it stays, drain the GPU "
                     "and reset it (nvidia-smi -r).")))


@renders("gpu.xid")
def _gpu_xid(f: Finding, _: Gettext) -> Texts:
    from trainguard.detectors.gpu import (
        XID_MEANINGS,  # with the detector's table, not a copy of it
    )

    gpu = _gpu(f)
    worst = int(f.value) if f.value is not None else int(f.details["xids"][-1])
    meaning, step = XID_MEANINGS.get(worst, XID_UNKNOWN)
    return Texts(
        fact=_("GPU {gpu} XID {xid}").format(gpu=gpu, xid=worst),
        subject=_("GPU {gpu} XID errors").format(gpu=gpu),
        what=_("GPU {gpu} reported XID {xid}: {meaning}.").format(gpu=gpu, xid=worst, meaning=_(meaning)),
        why=_("XIDs seen: {xids}.").format(xids=", ".join(str(x) for x in f.details.get("xids", [worst]))),
        step=plain(_(step)))


@renders("gpu.throttle")
def _gpu_throttle(f: Finding, _: Gettext) -> Texts:
    d, gpu = f.details, _gpu(f)
    facts = []
    if d.get("temperature_c") is not None:
        facts.append(f"{d['temperature_c']:.0f} °C")
    if d.get("power_w") is not None and d.get("power_limit_w"):
        facts.append(f"{d['power_w']:.0f}/{d['power_limit_w']:.0f} W")
    return Texts(
        fact=_("GPU {gpu} throttled ({reasons})").format(gpu=gpu, reasons=", ".join(d["reasons"])),
        subject=_("GPU {gpu} throttling").format(gpu=gpu),
        what=_("GPU {gpu} was slowed down ({reasons}) {share} of the time.").format(
            gpu=gpu, reasons=", ".join(d["reasons"]), share=format_ratio(d["share"]))
        + (f" {', '.join(facts)}." if facts else ""),
        why=_("Training runs slower meanwhile."),
        step=_("Check cooling and airflow (thermal) or the power supply and cap (power)."))


@renders("log.match")
def _log_match(f: Finding, _: Gettext) -> Texts:
    d = f.details
    path = str(d["file"])
    line = f.summary.split(": ", 1)[1] if ": " in f.summary else f.summary
    return Texts(
        fact=_("{file}: error in log").format(file=short_path(path.rsplit("/", 1)[-1], 30)),
        subject=_("log {file}").format(file=short_path(path)),
        what=_("{count} matching lines in {file}; the last: {line}").format(count=d["count"], file=path,
                                                                           line=scrub(line)),
        step=_(f.hint) if f.hint else "")


LIST_SEP = N_(", ")  # between the items of a list in a sentence
RISKY_WHAT = {"tfevents": N_("TensorBoard events"), "checkpoint": N_("checkpoints"), "log": N_("logs")}


@renders("gpu.risky_write")
def _gpu_risky_write(f: Finding, _: Gettext) -> Texts:
    from trainguard.diagnosis.verdict import short_command

    d, gpu, mp = f.details, _gpu(f), str(f.details["mountpoint"])
    files = list(d["files"])
    kinds = [c for c in RISKY_WHAT if c in d.get("categories", ())] or ["log"]  # riskiest first
    what = _(LIST_SEP).join(_(RISKY_WHAT[c]) for c in kinds)
    more = _(" and {n} more").format(n=len(files) - 1) if len(files) > 1 else ""
    return Texts(
        fact=_("GPU {gpu} job writes {what} on {mp}").format(gpu=gpu, what=_(RISKY_WHAT[kinds[0]]),
                                                             mp=short_path(mp, 20)),
        subject=_("GPU {gpu} writes on {mp}").format(gpu=gpu, mp=short_path(mp)),
        what=_("PID {pid} ({command}) on GPU {gpu} writes {what} on {fstype} {mp}: {file}{more}.").format(
            pid=d["pid"], command=short_command(str(d.get("cmdline") or "")), gpu=gpu, what=what,
            fstype=d["fstype"], mp=mp, file=files[0], more=more) + owners_sentence(f, _),
        why=_("When that share slows down or hangs, the training job stalls with it (moving logs to local "
              "disk made training 28 % faster in a field report)."),
        step=_("Write locally and mirror to the share with trainguard's [[mirror]]."))


def translated_sources() -> list[str]:
    """English texts defined outside this package that are rendered through the catalog."""
    from trainguard.detectors.gpu import XID_MEANINGS, _log_hint

    out = [m for pair in XID_MEANINGS.values() for m in pair]
    out += [_log_hint(p) for p in LOG_HINT_PATTERNS]
    return out
