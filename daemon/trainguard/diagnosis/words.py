"""The verdict and remedy of a stall diagnosis, said in a language from the diagnosis facts (pure).

diagnosis.verdict decides what the GPU's processes are stuck on and keeps it as facts, plain
JSON (`Diagnosis.facts`: the case, who, which file on which mount, for how long); this module
turns those facts into the sentence a person reads, through the gettext catalog of a language
(trainguard.i18n, docs/i18n.md). English is the source text: logs, `diagnose --json` and the
finding's summary carry it; alerts and `trainguard diagnose` render the facts in the reader's
language.
"""

from __future__ import annotations

from typing import Any, Mapping

from trainguard.i18n import N_, Gettext
from trainguard.units import format_duration

Facts = Mapping[str, Any]

VERBS = {"write": N_("writing"), "pwrite64": N_("writing"), "writev": N_("writing"), "pwritev": N_("writing"),
         "read": N_("reading"), "pread64": N_("reading"), "readv": N_("reading"), "preadv": N_("reading"),
         "fsync": N_("syncing"), "fdatasync": N_("syncing"), "close": N_("closing"), "ftruncate": N_("truncating"),
         "fstat": N_("stat-ing"), "fstatfs": N_("statfs-ing"), "fallocate": N_("allocating"),
         "statfs": N_("statfs-ing"), "openat": N_("opening a file"), "open": N_("opening a file"),
         "newfstatat": N_("stat-ing"), "statx": N_("stat-ing")}


def who_text(p: Facts, _: Gettext) -> str:
    """"PID 4242 [python train.py] thread pt_main_thread (python3)": the process and, if known, its thread."""
    text = _("PID {pid}").format(pid=p.get("pid"))
    if p.get("inferred"):
        text += _(" [{command}] (inferred: {evidence})").format(command=p.get("command", ""), evidence=p["inferred"])
    elif p.get("command"):
        text += f" [{p['command']}]"
    if p.get("thread"):
        thread = p["thread"] + (f" ({p['thread_os']})" if p.get("thread_os") and p["thread_os"] != p["thread"] else "")
        text += _(" thread {thread}").format(thread=thread)
    return text


OWNER_SEP = N_(", ")


def owner_text(o: Facts, _: Gettext) -> str:
    """"pod ml/train-7f (user alice, Slurm job 4242)": who a process belongs to; "" when nothing is known.

    The pod leads, else the container, else the Slurm job, else the user; the rest follows in brackets."""
    lead = ""
    if o.get("namespace") and o.get("pod"):
        lead = _("pod {namespace}/{pod}").format(namespace=o["namespace"], pod=o["pod"])
    elif o.get("pod_uid"):
        lead = _("pod {uid}").format(uid=o["pod_uid"])
    elif o.get("container_id"):
        cid = str(o["container_id"])[:12]
        lead = (_("{runtime} container {id}").format(runtime=o["runtime"], id=cid) if o.get("runtime")
                else _("container {id}").format(id=cid))
    job = _("Slurm job {job}").format(job=o["slurm_job"]) if o.get("slurm_job") else ""
    if not lead:
        lead, job = job, ""
    rest = [_("user {user}").format(user=o["user"])] if o.get("user") else []
    rest += [job] if job else []
    if o.get("slurm_account"):
        rest.append(_("account {account}").format(account=o["slurm_account"]))
    if not lead and rest:
        lead, rest = rest[0], rest[1:]
    return _("{lead} ({rest})").format(lead=lead, rest=_(OWNER_SEP).join(rest)) if rest else lead


def _on(f: Facts, _: Gettext) -> str:
    text = _(" on {fstype} at {mount}").format(fstype=f["fstype"], mount=f["mount"])
    if f.get("unresponsive_s") is not None:
        text += _(", mount unresponsive {stuck}").format(stuck=format_duration(f["unresponsive_s"]))
    return text


def _log(facts: Facts, _: Gettext) -> str:
    return _("; log: {line}").format(line=facts["log"]) if facts.get("log") else ""


def _blocked_on_file(facts: Facts, who: str, _: Gettext) -> str:
    syscall, path = facts.get("syscall") or "", facts["file"]
    if syscall in VERBS:
        text = _("{who} blocked {verb} {file}").format(who=who, verb=_(VERBS[syscall]), file=path)
    else:
        text = _("{who} blocked in {syscall}() on {file}").format(who=who, syscall=syscall, file=path)
    if facts.get("fstype"):
        return text + _on(facts, _)
    if facts.get("mount"):
        return text + _(" (local disk at {mount})").format(mount=facts["mount"])
    return text + _(" (local disk)")


def verdict_text(facts: Facts, _: Gettext) -> str:
    """One line: what the GPU's processes are stuck on."""
    case, who = facts["case"], who_text(facts["process"], _) if facts.get("process") else ""
    if case == "blocked_on_file":
        return _blocked_on_file(facts, who, _)
    if case == "blocked_with_remote_file":
        return _("{who} blocked in {wait} (filesystem wait); it has {file} open").format(
            who=who, wait=facts["wait"], file=facts["file"]) + _on(facts, _)
    if case == "blocked":
        wait = facts.get("wait") or _("uninterruptible I/O")
        return _("{who} blocked in {wait} ({state} state)").format(who=who, wait=wait, state=facts["state"])
    if case == "no_process":
        return _("no process on this GPU that trainguard can see: NVML reported none, and no process here holds "
                 "an NVIDIA device") + _log(facts, _)
    if case == "not_inspectable":
        return _("cannot inspect the GPU's processes: {why}; no process in this PID namespace holds an NVIDIA "
                 "device").format(why=facts["why"]) + _log(facts, _)
    if case == "io_moving":
        return _("no thread blocked on I/O; {who} is still reading/writing (I/O counters moved)").format(
            who=who) + _log(facts, _)
    if case == "log_error":
        return _("no thread blocked on I/O; log: {line}").format(line=facts["log"])
    if case == "timed_out":
        return _timed_out(facts, _)
    return _("no thread blocked on I/O and no I/O progress")


def _timed_out(facts: Facts, _: Gettext) -> str:
    text = _("diagnosis timed out after {deadline} (reading /proc or py-spy is slow; it goes on in the "
             "background)").format(deadline=format_duration(facts["deadline_s"]))
    stuck = facts.get("unresponsive_mounts") or []
    if stuck:
        text += (_("; unresponsive mounts: {mounts}") if len(stuck) > 1 else _("; unresponsive mount: {mounts}")
                 ).format(mounts=", ".join(stuck[:4]))
    return text + _log(facts, _)


def mirror_text(_: Gettext) -> str:
    return _("mirror it to the share with trainguard's [[mirror]]")


def remote_remedy(category: str, kind: str, mount: str, unresponsive: bool, _: Gettext) -> str:
    """What to do about a file on a network/FUSE mount that stalls the job."""
    if category == "tfevents":
        text = _("TensorBoard's event writer is stuck on the shared filesystem: log to local disk "
                 "(e.g. SummaryWriter('/tmp/runs')) and {mirror} (or rsync it in the background); "
                 "if it must stay there, raise flush_secs and lower max_queue").format(mirror=mirror_text(_))
    elif category == "checkpoint":
        text = _("save checkpoints to local disk first and {mirror}, so a slow share cannot stall "
                 "training").format(mirror=mirror_text(_))
    else:
        text = _("move this file off {mount} to local disk and {mirror}").format(mount=mount, mirror=mirror_text(_))
    if unresponsive:
        text += (_(". {mount} is not answering: check its FUSE daemon; the job continues by itself if the mount "
                   "recovers") if kind == "fuse" else
                 _(". {mount} is not answering: check its server/network; the job continues by itself if the "
                   "mount recovers")).format(mount=mount)
    return text


REMEDIES = {
    "blocked_local": N_("check that disk's health and load (iostat -x); the write is not progressing"),
    "blocked": N_("find the file it waits on (ls -l /proc/PID/fd, cat /proc/PID/task/TID/stack) and the mount "
                  "under it"),
    "no_process": N_("run trainguard in the trainer's container (or with the host PID namespace) to attribute "
                     "the stall"),
    "not_inspectable": N_("run trainguard in the host PID namespace (container: pid: host) or in the trainer's "
                          "container to attribute the stall"),
    "io_moving": N_("it may be loading data or saving slowly: check the data loader and the storage throughput"),
    "log_error": N_("the training loop likely died or waits after this error: check the log and restart the job"),
    "idle": N_("dump the Python stacks (py-spy dump --pid PID) to see what it waits on: a data loader, an NCCL "
               "collective waiting for another rank, or a lock"),
    "timed_out": N_("the alert is sent again with the full diagnosis once it is in; or run `trainguard diagnose`"),
}


def remedy_text(facts: Facts, _: Gettext) -> str:
    """The next step for the verdict."""
    case = facts["case"]
    if case in ("blocked_on_file", "blocked_with_remote_file") and facts.get("fstype"):
        return remote_remedy(facts["category"], facts["kind"], facts["mount"], facts.get("unresponsive_s") is not None, _)
    if case == "blocked_on_file":
        return _(REMEDIES["blocked_local"])
    return _(REMEDIES[case])


# --- a hang across the ranks of one run (diagnosis.ranks) -----------------------------------------

def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:12]) + (", ..." if len(ranks) > 12 else "")


def _rank_doing(r: Facts, _: Gettext) -> str:
    """"rank 2 (PID 4121) is in DataLoader.__next__ (Shard.__getitem__ (x.py:10)) reading /data/x.bin on /mnt"."""
    who = _("rank {rank} (PID {pid})").format(rank=r["rank"], pid=r["pid"])
    if r.get("kind") == "gone":
        return _("{who} has exited").format(who=who)
    frame = r.get("frame") or _("an unknown frame")
    if r.get("at") and not r["at"].startswith(frame + " "):
        frame += f" [{r['at']}]"
    text = _("{who} is in {frame}").format(who=who, frame=frame)
    if r.get("file"):
        verb = _(VERBS[r["syscall"]]) if r.get("syscall") in VERBS else _("waiting on")
        text += _(" {verb} {file}").format(verb=verb, file=r["file"])
        if r.get("mount"):
            text += _(" (mount {mount})").format(mount=r["mount"])
    if r.get("state") == "D":
        text += _(", D state")
    return text


def run_verdict_text(details: Facts, _: Gettext) -> str:
    """One line: which rank holds the others and where, or why none does."""
    verdict, waiting = details.get("verdict", "unknown"), details.get("waiting_ranks") or []
    if verdict == "rank_holds_collective":
        text = _("{holder}; ranks {ranks} wait in {collective}").format(
            holder=_rank_doing(details["holder"], _), ranks=_ranks(waiting), collective=details["collective"])
    elif verdict == "all_in_collective":
        text = _("all {count} ranks here wait in {collective}, none holds them: a rank on another host, a dead "
                 "peer or a communication fault").format(count=len(waiting), collective=details["collective"])
    elif verdict == "blocked_io":
        text = _("{rank} (blocked I/O)").format(rank=_rank_doing(details["blocked_rank"], _))
    elif verdict == "dataloader_deadlock":
        text = _("{rank}, waiting for its data-loader workers (data-loader deadlock)").format(
            rank=_rank_doing(details["blocked_rank"], _))
    else:
        text = _("no rank is blocked on I/O and none holds the others in a collective")
    if details.get("stacks") in RANK_STACK_NOTES:
        text += "; " + _(RANK_STACK_NOTES[details["stacks"]])
    return text


RANK_STACK_NOTES = {
    "off": N_("py-spy is turned off ([gpu] py_spy = false): no stacks, only what /proc shows"),
    "missing": N_("py-spy is not installed: no stacks, only what /proc shows"),
    "failed": N_("py-spy could not read the ranks (no ptrace rights?): no stacks, only what /proc shows"),
}
NCCL_STEP = N_("set NCCL_DEBUG=WARN; for the flight recorder's record at the timeout, start the job with "
               "TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/tmp/nccl_trace_rank_ "
               "(older PyTorch: TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE)")


def run_remedy_text(details: Facts, _: Gettext) -> str:
    """The next steps: the holder's mount or disk (or its stack), then NCCL's own diagnostics."""
    verdict = details.get("verdict", "unknown")
    r = details.get("holder") or details.get("blocked_rank") or {}
    if r.get("kind") == "gone":
        first = _("find why rank {rank} exited (its log, dmesg for the OOM killer); the job must be "
                  "restarted").format(rank=r["rank"])
    elif r.get("mount"):
        first = _("check {mount} (its server or FUSE daemon) or the disk under {file}: the job goes on once the "
                  "read or write returns").format(mount=r["mount"], file=r["file"])
    elif r.get("file"):
        first = _("check the disk under {file} (iostat -x)").format(file=r["file"])
    elif r.get("dataloader"):
        first = _("dump its data-loader workers (py-spy dump --pid on PID {pid}'s children); num_workers=0 "
                  "confirms a worker deadlock").format(pid=r["pid"])
    elif r:
        first = _("look at rank {rank}'s stack (py-spy dump --pid {pid}): the others wait for it").format(
            rank=r["rank"], pid=r["pid"])
    elif verdict == "all_in_collective":
        first = _("check the job's ranks on the other hosts and the network between them")
    else:
        first = _("dump each rank's stack (py-spy dump --pid PID)")
    return _("{first}; {nccl}").format(first=first, nccl=_(NCCL_STEP))
