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
                   /kubepods/besteffort/pod<uid>/<64 hex>       (uid in the path: namespace/name from env)
      Slurm (v2)   /system.slice/slurmstepd.scope/job_<id>/step_<n>/...
      Slurm (v1)   /slurm/uid_<u>/job_<id>/step_<n>/...

  Path components are matched wherever they sit, so a reader whose cgroup namespace is not the
  host's (paths then start below its own root, or climb out with "/..") still recognises them.
  Anything else (dockerd's own docker.service, crio-conmon-<id>.scope, a login session) gives nothing:
  never a guess.
- /proc/PID/status: the real Uid, named through the passwd database trainguard sees (else the number).
- /proc/PID/environ: only the named keys below are kept (the environment can hold secrets; it is
  never logged), read at most ENVIRON_LIMIT bytes. A pod's namespace and name come from the
  downward API variables only when the cgroup path says the process is in a pod.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

ENVIRON_LIMIT = 256 * 1024  # the kernel allows more, but no environment worth reading is that large
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_ACCOUNT", "SLURM_JOB_USER", "SLURM_STEP_ID")
# Downward API variables (fieldRef metadata.namespace / metadata.name), as the Kubernetes docs spell them.
POD_NAMESPACE_KEYS = ("POD_NAMESPACE", "MY_POD_NAMESPACE", "K8S_POD_NAMESPACE")
POD_NAME_KEYS = ("POD_NAME", "MY_POD_NAME", "K8S_POD_NAME")
ENV_KEYS = SLURM_KEYS + POD_NAMESPACE_KEYS + POD_NAME_KEYS

_HEX64 = r"[0-9a-f]{64}"
_SCOPES = (  # one cgroup path component -> runtime
    (re.compile(rf"docker-({_HEX64})\.scope"), "docker"),
    (re.compile(rf"cri-containerd-({_HEX64})\.scope"), "containerd"),
    (re.compile(rf"crio-({_HEX64})\.scope"), "cri-o"),
    (re.compile(rf"libpod-({_HEX64})\.scope"), "podman"),
)
_BARE_ID = re.compile(_HEX64)
_LIBPOD_CGROUPFS = re.compile(rf"libpod-({_HEX64})")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_SLICE = re.compile(rf"kubepods(?:-(?:burstable|besteffort))?-pod({_UID})\.slice")
_POD_DIR = re.compile(rf"pod({_UID})")
_QOS_SLICES = {"kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"}
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


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c and c != ".."]


def _container(parts: list[str]) -> tuple[str | None, str] | None:
    """(runtime or None, id) from one path's components."""
    for i, part in enumerate(parts):
        for pattern, runtime in _SCOPES:
            match = pattern.fullmatch(part)
            if match:
                return runtime, match.group(1)
        if part == "docker" and i + 1 < len(parts) and _BARE_ID.fullmatch(parts[i + 1]):
            return "docker", parts[i + 1]
        if part == "libpod_parent" and i + 1 < len(parts) and (m := _LIBPOD_CGROUPFS.fullmatch(parts[i + 1])):
            return "podman", m.group(1)
        # cgroupfs driver: /kubepods/<qos>/pod<uid>/<id>; the runtime is not in the path.
        if _POD_DIR.fullmatch(part) and _under_kubepods(parts, i) and i + 1 < len(parts) \
                and _BARE_ID.fullmatch(parts[i + 1]):
            return None, parts[i + 1]
    return None


def _under_kubepods(parts: list[str], i: int) -> bool:
    """parts[i] (pod<uid>) sits right under /kubepods or /kubepods/<burstable|besteffort>."""
    if i >= 1 and parts[i - 1] == "kubepods":
        return True
    return i >= 2 and parts[i - 2] == "kubepods" and parts[i - 1] in ("burstable", "besteffort")


def _pod_uid(parts: list[str]) -> str | None:
    for i, part in enumerate(parts):
        match = _POD_SLICE.fullmatch(part)
        if match and i >= 1 and parts[i - 1] in _QOS_SLICES:
            return match.group(1).replace("_", "-")
        match = _POD_DIR.fullmatch(part)
        if match and "_" not in match.group(1) and _under_kubepods(parts, i):
            return match.group(1)
    return None


def _slurm(parts: list[str]) -> tuple[str, str | None] | None:
    """(job id, step or None) from .../slurmstepd.scope/job_N[/step_S] or /slurm/uid_U/job_N[/step_S]."""
    for i, part in enumerate(parts):
        if _STEPD.fullmatch(part):
            rest = parts[i + 1:]
        elif _SLURM_V1.fullmatch(part) and i + 1 < len(parts) and re.fullmatch(r"uid_\d+", parts[i + 1]):
            rest = parts[i + 2:]
        else:
            continue
        job = _JOB.fullmatch(rest[0]) if rest else None
        if job is None:
            return None
        step = _STEP.fullmatch(rest[1]) if len(rest) > 1 else None
        return job.group(1), step.group(1) if step else None
    return None


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


def parse_cgroup(cgroup_text: str) -> CgroupFacts:
    """Container, pod uid and Slurm job of /proc/PID/cgroup text (v1 or v2); unknown layouts give nothing."""
    container: tuple[str | None, str] | None = None
    pod_uid: str | None = None
    slurm: tuple[str, str | None] | None = None
    for path in _paths(cgroup_text):
        parts = _components(path)
        container = container or _container(parts)
        pod_uid = pod_uid or _pod_uid(parts)
        slurm = slurm or _slurm(parts)
    return CgroupFacts(container[0] if container else None, container[1] if container else None, pod_uid,
                       slurm[0] if slurm else None, slurm[1] if slurm else None)


def parse_uid(status_text: str) -> int | None:
    """The real uid from /proc/PID/status ("Uid:\treal\teffective\tsaved\tfs")."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def parse_environ(data: bytes | str, keys: Iterable[str] = ENV_KEYS) -> dict[str, str]:
    """Only the named keys of /proc/PID/environ text; everything else is dropped unread."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    wanted = set(keys)
    found: dict[str, str] = {}
    for entry in text.split("\0"):
        key, sep, value = entry.partition("=")
        if sep and key in wanted:
            found[key] = value
    return found


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


def owner_of(cgroup_text: str, status_text: str, env: Mapping[str, str],
             lookup: Callable[[int], "pwd.struct_passwd"] = pwd.getpwuid) -> Owner:
    """The owner facts from the three texts (env: parse_environ's named keys)."""
    cg = parse_cgroup(cgroup_text)
    uid = parse_uid(status_text)
    namespace = pod = None
    if cg.pod_uid is not None:  # only then do POD_* variables mean a pod
        namespace = _first(env, POD_NAMESPACE_KEYS, _DNS_LABEL)
        pod = _first(env, POD_NAME_KEYS, _DNS_NAME)
    job, step = cg.slurm_job, cg.slurm_step
    env_job = _first(env, ("SLURM_JOB_ID",), re.compile(r"\d{1,12}"))
    if job is None and env_job is not None:
        job, step = env_job, _first(env, ("SLURM_STEP_ID",), re.compile(r"\d{1,9}|batch|extern|interactive"))
    same_job = job is not None and (env_job is None or env_job == job)  # account/user of this job, not another
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
    return owner_of(cgroup_text, status_text, _environ(proc_root, pid, parse_cgroup(cgroup_text)))


def _environ(proc_root: str, pid: int, cg: CgroupFacts) -> dict[str, str]:
    """The named keys, read only when they can add something: in a pod, in a Slurm job, or outside any
    container (a Slurm node without its cgroup plugin); a plain container's environment is left alone."""
    if cg.pod_uid is None and cg.slurm_job is None and cg.container_id is not None:
        return {}
    return parse_environ(_read(f"{proc_root}/{pid}/environ", ENVIRON_LIMIT) or b"")
