"""Whose process is it: container, Kubernetes pod, Slurm job and user, from /proc/PID (pure parsers).

A fleet operator reading "PID 8123 stalled" still has to find whose job it is. The kernel says it in
three places, all procfs, none of them touching a filesystem the process uses:

- /proc/PID/cgroup: the cgroup path names the container runtime's scope and the pod or Slurm job
  around it. Known layouts only (cgroup v2 and v1, systemd and cgroupfs drivers):

      docker       /system.slice/docker-<64 hex>.scope          /docker/<64 hex>
      containerd   .../cri-containerd-<64 hex>.scope
      CRI-O        .../crio-<64 hex>.scope
      podman       .../libpod-<64 hex>.scope                    /libpod_parent/libpod-<64 hex>
      pod          /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/...
                   /kubepods.slice/kubepods-pod<uid>.slice/...  (guaranteed QoS: no QoS slice)
                   /kubepods/besteffort/pod<uid>/<64 hex>       (uid in the path: namespace/name from env)
      Slurm (v2)   /system.slice/slurmstepd.scope/job_<id>/step_<n>/...
      Slurm (v1)   /slurm/uid_<u>/job_<id>/step_<n>/...

  Path components are matched wherever they sit: a reader in its own cgroup namespace (a DaemonSet
  pod) sees paths relative to its root, climbing out with "/.." (another pod of its QoS class:
  /../../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope). A parent that is shown must
  be the one the layout requires; one that is not (climbed over) cannot contradict. Runtimes nest (kind,
  Docker-in-Docker): the innermost container is the process's. Anything else (dockerd's own
  docker.service, crio-conmon-<id>.scope, a login session, an id inside another name) gives nothing:
  never a guess.
- /proc/PID/status: the real Uid, named through the passwd database trainguard sees (else the number).
- /proc/PID/environ: only the named keys below are kept (the environment can hold secrets; it is
  never logged), read at most ENVIRON_LIMIT bytes; an entry that limit cut is dropped. A pod's
  namespace and name come from the downward API variables only when the cgroup path says the process
  is in that pod's own container, and not when POD_UID names another pod. Slurm's account and user
  only when SLURM_JOB_ID is the cgroup's job.
"""

from __future__ import annotations

import functools
import pwd
import re
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

ENVIRON_LIMIT = 256 * 1024  # the kernel allows more, but no environment worth reading is that large
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_ACCOUNT", "SLURM_JOB_USER", "SLURM_STEP_ID")
# Downward API variables (fieldRef metadata.namespace / metadata.name), as the Kubernetes docs spell them.
POD_NAMESPACE_KEYS = ("POD_NAMESPACE", "MY_POD_NAMESPACE", "K8S_POD_NAMESPACE")
POD_NAME_KEYS = ("POD_NAME", "MY_POD_NAME", "K8S_POD_NAME")
POD_UID_KEYS = ("POD_UID", "MY_POD_UID", "K8S_POD_UID")  # fieldRef metadata.uid: checked against the cgroup's
ENV_KEYS = SLURM_KEYS + POD_NAMESPACE_KEYS + POD_NAME_KEYS + POD_UID_KEYS

_HEX64 = r"[0-9a-f]{64}"
_SCOPES = (  # one cgroup path component -> runtime
    (re.compile(rf"docker-({_HEX64})\.scope"), "docker"),
    (re.compile(rf"cri-containerd-({_HEX64})\.scope"), "containerd"),
    (re.compile(rf"crio-({_HEX64})\.scope"), "cri-o"),
    (re.compile(rf"libpod-({_HEX64})\.scope"), "podman"),
)
_BARE_ID = re.compile(_HEX64)
_LIBPOD_CGROUPFS = re.compile(rf"libpod-({_HEX64})")
_UID_GROUPS = [f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12)]
_UID = "-".join(_UID_GROUPS)
_UID_ESCAPED = "_".join(_UID_GROUPS)  # in a slice name "-" means a level, so the kubelet writes "_"
# "<parent>-pod<uid>.slice" under "<parent>.slice": systemd's naming, with the kubelet's optional
# cgroup root in front (kind: kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/...).
_POD_SLICE = re.compile(rf"((?:[A-Za-z0-9_.:]+-)*kubepods(?:-burstable|-besteffort)?)-pod({_UID_ESCAPED})\.slice")
_POD_DIR = re.compile(rf"pod({_UID})")
_STEPD = re.compile(r"(?:[A-Za-z0-9.-]+_)?slurmstepd\.scope")  # "<node>_slurmstepd.scope": multiple slurmd
_SLURM_V1 = re.compile(r"slurm(?:_[A-Za-z0-9.-]+)?")
_JOB = re.compile(r"job_(\d{1,12})")
_STEP = re.compile(r"step_(\d{1,9}|batch|extern|interactive)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_WORD = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")  # an account or user name fit for a label and a title


@dataclass(frozen=True, slots=True)
class Owner:
    """What is known about whose a process is; every field None when unknown."""

    runtime: str | None = None  # docker / containerd / cri-o / podman; None when the layout does not say
    container_id: str | None = None  # the full 64-hex id
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    slurm_job: str | None = None
    slurm_step: str | None = None
    slurm_account: str | None = None
    slurm_user: str | None = None
    user: str | None = None  # the process's real user, by name, else the uid as a number
    uid: int | None = None

    def to_dict(self) -> dict[str, str | int]:
        """The known fields only (what the diagnosis JSON and the finding carry)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    runtime: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None
    slurm_step: str | None = None
    # The process sits in the pod's own container, not in a runtime or a Slurm job nested inside it: only
    # then is its environment the one the kubelet gave the pod, and POD_* may name it.
    pod_env: bool = False


def _components(path: str) -> list[str]:
    """The components below the reader's cgroup namespace root: one in its own namespace (a DaemonSet
    pod) climbs out of that root with leading "/.."; what they climbed over is not shown."""
    parts = [c for c in path.split("/") if c]
    climbed = 0
    while climbed < len(parts) and parts[climbed] == "..":
        climbed += 1
    parts = parts[climbed:]
    return [] if "." in parts or ".." in parts else parts  # no kernel writes those further in


def _parent_is(parts: list[str], i: int, names: tuple[str, ...]) -> bool:
    """parts[i]'s parent is one of names, or it is not shown (the first component's), so it cannot contradict."""
    return i == 0 or parts[i - 1] in names


def _pod(parts: list[str]) -> tuple[int, str] | None:
    """(index, uid) of the pod's cgroup: a systemd pod slice under the slice its name says, or a cgroupfs
    pod<uid> under /kubepods[/burstable|/besteffort]; a parent that is shown must be the right one."""
    found = None
    for i, part in enumerate(parts):
        if match := _POD_SLICE.fullmatch(part):
            if _parent_is(parts, i, (f"{match.group(1)}.slice",)):
                found = i, match.group(2).replace("_", "-")
        elif (match := _POD_DIR.fullmatch(part)) and (
                _parent_is(parts, i, ("kubepods",))
                or (parts[i - 1] in ("burstable", "besteffort") and _parent_is(parts, i - 1, ("kubepods",)))):
            found = i, match.group(1)
    return found


def _container(parts: list[str], pod_at: int | None) -> tuple[int, str | None, str] | None:
    """(index, runtime or None, id) of the innermost container: kind and Docker-in-Docker nest one
    runtime's scope inside another's, and the process belongs to the inner one."""
    found = None
    for i, part in enumerate(parts):
        parent = parts[i - 1] if i else None
        for pattern, runtime in _SCOPES:
            if match := pattern.fullmatch(part):
                found = i, runtime, match.group(1)
                break
        else:
            if parent == "docker" and _BARE_ID.fullmatch(part):
                found = i, "docker", part
            elif parent == "libpod_parent" and (match := _LIBPOD_CGROUPFS.fullmatch(part)):
                found = i, "podman", match.group(1)
            elif pod_at == i - 1 and _POD_DIR.fullmatch(parent or "") and _BARE_ID.fullmatch(part):
                found = i, None, part  # cgroupfs driver: /kubepods/<qos>/pod<uid>/<id>, runtime not named
    return found


def _slurm(parts: list[str]) -> tuple[int, str, str | None] | None:
    """(index, job id, step or None) of the innermost .../slurmstepd.scope/job_N[/step_S] or
    /slurm/uid_U/job_N[/step_S]; slurmstepd's own scope, without a job, is none."""
    found = None
    for i, part in enumerate(parts):
        if _STEPD.fullmatch(part):
            at = i + 1
        elif _SLURM_V1.fullmatch(part) and i + 1 < len(parts) and re.fullmatch(r"uid_\d+", parts[i + 1]):
            at = i + 2
        else:
            continue
        if at < len(parts) and (job := _JOB.fullmatch(parts[at])):
            step = _STEP.fullmatch(parts[at + 1]) if at + 1 < len(parts) else None
            found = at, job.group(1), step.group(1) if step else None
    return found


def _paths(cgroup_text: str) -> list[str]:
    """Cgroup paths of /proc/PID/cgroup, the v2 ("0::") line first, then v1 hierarchies in order."""
    unified, legacy = [], []
    for line in cgroup_text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and path.startswith("/")):
            continue
        (unified if hierarchy == "0" and not controllers else legacy).append(path)
    return unified + legacy


def _path_facts(path: str) -> CgroupFacts | None:
    parts = _components(path)
    pod = _pod(parts)
    container = _container(parts, pod[0] if pod else None)
    slurm = _slurm(parts)
    if not (pod or container or slurm):
        return None
    pod_env = (pod is not None and container is not None and container[0] == pod[0] + 1
               and (slurm is None or slurm[0] < container[0]))
    return CgroupFacts(container[1] if container else None, container[2] if container else None,
                       pod[1] if pod else None, slurm[1] if slurm else None, slurm[2] if slurm else None, pod_env)


@functools.lru_cache(maxsize=1024)  # every process of a container, every cycle, brings the same text back
def parse_cgroup(cgroup_text: str) -> CgroupFacts:
    """Container, pod uid and Slurm job of /proc/PID/cgroup text (v1 or v2), all from the first path
    that names any (v2 first), so facts of two hierarchies are never mixed; unknown layouts give nothing."""
    for path in _paths(cgroup_text):
        if facts := _path_facts(path):
            return facts
    return CgroupFacts()


def parse_uid(status_text: str) -> int | None:
    """The real uid from /proc/PID/status ("Uid:\treal\teffective\tsaved\tfs")."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def parse_environ(data: bytes | str, keys: Iterable[str] = ENV_KEYS) -> dict[str, str]:
    """Only the named keys of /proc/PID/environ text; everything else is dropped unread.

    The kernel ends every entry with a NUL: what follows the last one is an entry that the read limit
    cut, and a cut value names someone else (pod "train-7f-5d9c8" read as "train-7f"), so it is dropped.
    A key set twice (execve takes any list) resolves as getenv(3) resolves it, to its first entry: the
    value the process itself sees."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    wanted = set(keys)
    found: dict[str, str] = {}
    for entry in text.split("\0")[:-1]:
        key, sep, value = entry.partition("=")
        if sep and key in wanted and key not in found:
            found[key] = value
    return found


def read_environ(proc_root: str, pid: int, keys: Iterable[str] = ENV_KEYS) -> tuple[dict[str, str], bool]:
    """(the named keys of the environment PID started with, whether the whole environment was read).

    At most ENVIRON_LIMIT bytes are read: a huge environment costs a bounded read, never the daemon's memory."""
    data = _read(f"{proc_root}/{pid}/environ", ENVIRON_LIMIT + 1) or b""
    return parse_environ(data[:ENVIRON_LIMIT], keys), len(data) <= ENVIRON_LIMIT


def _first(env: Mapping[str, str], keys: tuple[str, ...], pattern: re.Pattern[str]) -> str | None:
    for key in keys:
        value = env.get(key, "").strip()
        if value and pattern.fullmatch(value):
            return value
    return None


def user_name(uid: int, lookup: Callable[[int], "pwd.struct_passwd"] = pwd.getpwuid) -> str:
    try:
        return lookup(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _agrees(value: str | None, truth: str, complete: bool) -> bool:
    """An environment value agrees with the cgroup: it is the same, or it is absent from an environment
    read whole (in a cut one, the entry that says otherwise may be in the part not read)."""
    return value == truth or (value is None and complete)


def owner_of(cgroup_text: str, status_text: str, env: Mapping[str, str],
             lookup: Callable[[int], "pwd.struct_passwd"] = pwd.getpwuid, complete: bool = True) -> Owner:
    """The owner facts from the three texts (env: parse_environ's named keys; complete: False when the
    read stopped at ENVIRON_LIMIT, so some entries were never seen). The cgroup names the owner; the
    environment only adds names to it, and only where it agrees (not another pod's uid, not another job)."""
    cg = parse_cgroup(cgroup_text)
    uid = parse_uid(status_text)
    if not _env_speaks(cg):
        env = {}
    namespace = pod = None
    env_uid = next((env[k].strip() for k in POD_UID_KEYS if env.get(k, "").strip()), None)
    if cg.pod_env and cg.pod_uid and _agrees(env_uid, cg.pod_uid, complete):
        namespace = _first(env, POD_NAMESPACE_KEYS, _DNS_LABEL)
        pod = _first(env, POD_NAME_KEYS, _DNS_NAME)
    job, step = cg.slurm_job, cg.slurm_step
    env_job = _first(env, ("SLURM_JOB_ID",), re.compile(r"\d{1,12}"))
    if job is None and env_job is not None:
        job, step = env_job, _first(env, ("SLURM_STEP_ID",), re.compile(r"\d{1,9}|batch|extern|interactive"))
    same_job = job is not None and _agrees(env_job, job, complete)  # account/user of this job, not another
    return Owner(cg.runtime, cg.container_id, cg.pod_uid, namespace, pod, job, step,
                 _first(env, ("SLURM_JOB_ACCOUNT",), _WORD) if same_job else None,
                 _first(env, ("SLURM_JOB_USER",), _WORD) if same_job else None,
                 user_name(uid, lookup) if uid is not None else None, uid)


def _read(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except (OSError, ValueError):
        return None


def read_owner(proc_root: str, pid: int, cgroup_text: str | None = None, status_text: str | None = None) -> Owner:
    """The owner of proc_root/PID (texts already read may be passed); an empty Owner when it is gone."""
    if cgroup_text is None:
        cgroup_text = (_read(f"{proc_root}/{pid}/cgroup", 64 * 1024) or b"").decode("utf-8", "replace")
    if status_text is None:
        status_text = (_read(f"{proc_root}/{pid}/status", 64 * 1024) or b"").decode("utf-8", "replace")
    env, complete = _environ(proc_root, pid, parse_cgroup(cgroup_text))
    return owner_of(cgroup_text, status_text, env, complete=complete)


def _env_speaks(cg: CgroupFacts) -> bool:
    """Can the environment add something: in a pod's own container, in a Slurm job, or outside any
    container (a Slurm node without its cgroup plugin)? A plain container's environment, or one nested
    inside a pod, is left alone."""
    return cg.pod_env or cg.slurm_job is not None or not (cg.container_id or cg.pod_uid)


def _environ(proc_root: str, pid: int, cg: CgroupFacts) -> tuple[dict[str, str], bool]:
    """(the named keys, whether the whole environment was read), read only where it speaks."""
    if not _env_speaks(cg):
        return {}, True
    return read_environ(proc_root, pid)
