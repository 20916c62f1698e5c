"""Texts for training-run findings: a run that stopped progressing, a run that ended with an error
(see notify/texts.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainguard.i18n import N_, Gettext
from trainguard.notify.renderers import Texts, plain, renders
from trainguard.notify.texts_gpu import owners_sentence
from trainguard.records import Finding
from trainguard.redact import scrub
from trainguard.units import format_duration

EVIDENCE = {
    "spinning": N_("Its GPUs show full utilisation at low power: the ranks wait in a collective that never "
                   "completes."),
    "idle": N_("Its GPUs are idle."),
    "blocked": N_("A rank is blocked in I/O."),
    "no_cpu": N_("None of its processes uses CPU time."),
}


def _numbers(values: Any) -> str:
    return ", ".join(str(v) for v in values)


def holder_sentence(d: Mapping[str, Any], _: Gettext) -> str:
    """"Rank 2 (PID 4121) is in DataLoader.__next__ reading /root/autodl-fs/x.bin; ranks 0, 1, 3 wait in
    all_reduce." from the diagnosis's facts; "" without a holder."""
    holder = d.get("holder")
    if not isinstance(holder, Mapping) or holder.get("pid") is None:
        return ""
    where = _("Rank {rank} (PID {pid}) holds the others").format(rank=holder.get("rank", "?"), pid=holder["pid"])
    if holder.get("frame") and holder.get("file"):
        where = _("Rank {rank} (PID {pid}) is in {frame} reading {file}").format(
            rank=holder.get("rank", "?"), pid=holder["pid"], frame=holder["frame"], file=holder["file"])
    elif holder.get("frame"):
        where = _("Rank {rank} (PID {pid}) is in {frame}").format(
            rank=holder.get("rank", "?"), pid=holder["pid"], frame=holder["frame"])
    waiting = d.get("waiting_ranks") or ()
    if waiting:
        wait = _("ranks {ranks} wait in {collective}").format(ranks=_numbers(waiting),
                                                              collective=d.get("collective") or _("a collective"))
        return _("{holder}; {waiting}.").format(holder=where, waiting=wait)
    return _("{holder}.").format(holder=where)


def _stalls_sentence(d: Mapping[str, Any], _: Gettext) -> str:
    stalls = d.get("stalls") or ()
    if not stalls:
        return ""
    return " " + _("GPU {gpus} also stalled (VRAM full, nearly idle).").format(
        gpus=_numbers(s.get("gpu") for s in stalls))


def _why(d: Mapping[str, Any], _: Gettext) -> str:
    sentence = holder_sentence(d, _)
    if sentence:
        return sentence
    from trainguard.diagnosis.words import run_verdict_text

    if d.get("verdict"):  # the cross-rank diagnosis's own line
        return run_verdict_text(d, _)
    return _("One rank is probably stuck (a hung read, a dead peer) and the others wait for it.")


def _step(d: Mapping[str, Any], _: Gettext) -> str:
    from trainguard.diagnosis.words import run_remedy_text

    if d.get("verdict"):
        return run_remedy_text(d, _)
    pids = _numbers(r["pid"] for r in d.get("ranks", ())[:4])
    return _("See where each rank is: py-spy dump --pid {pids}; check the mount or disk of the one that is not "
             "in a collective; rerun with NCCL_DEBUG=WARN.").format(pids=pids or "PID")


@renders("train.hang")
def _train_hang(f: Finding, _: Gettext) -> Texts:
    d = f.details
    silent, run = format_duration(d["silent_for_s"]), str(d["run"])
    gap = d.get("normal_gap_s") or 0.0
    what = (_("Training run {run} ({ranks} ranks) has made no progress for {silent}; its normal gap is {gap}, "
              "the timeout {timeout}.") if gap else
            _("Training run {run} ({ranks} ranks) has made no progress for {silent} (timeout {timeout}).")).format(
        run=run, ranks=len(d["ranks"]), silent=silent, gap=format_duration(gap),
        timeout=format_duration(d["timeout_s"]))
    evidence = EVIDENCE.get(str(d.get("gpu_evidence")))
    if evidence:
        what += " " + _(evidence)
    return Texts(
        fact=_("Training hung: {run} no progress for {silent}").format(run=run, silent=silent),
        subject=_("training run {run}").format(run=run),
        what=what + _stalls_sentence(d, _) + owners_sentence(f, _),
        why=plain(_why(d, _)),
        step=plain(_step(d, _)))


@renders("train.exit")
def _train_exit(f: Finding, _: Gettext) -> Texts:
    d = f.details
    run = str(d["run"])
    fact = _("Training {run} was killed") if d.get("how") == "killed" else _("Training {run} ended with an error")
    return Texts(
        fact=fact.format(run=run),
        subject=_("training run {run}").format(run=run),
        what=_("Training run {run} ended; the end of its output says: {error}").format(
            run=run, error=scrub(str(d["error"]))) + owners_sentence(f, _),
        why=_("It is not hung: its processes are gone."),
        step=_("Read the end of its output and restart it from its last checkpoint."))
