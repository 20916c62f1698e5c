"""Properties of the owner parsers over generated cgroup paths and environments.

Paths are built from the layouts the runtimes make (docker, podman, the kubelet's pods with both
drivers and an optional cgroup root as kind uses, slurmstepd's jobs), nested in any order a host can
show (kind, Docker-in-Docker, Slurm inside a pod), with sub-cgroups and look-alike names in between,
and shown as a reader in a cgroup namespace rooted anywhere sees them. Whatever is named must be
what the path encodes, and everything still shown must be named. Environments are cut at every byte:
no value is ever a cut one, and a cut environment never names what the whole one would not."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard.sources.owner import (ENV_KEYS, POD_NAME_KEYS, POD_NAMESPACE_KEYS, POD_UID_KEYS, CgroupFacts,
                                      owner_of, parse_cgroup, parse_environ)

SETTINGS = settings(max_examples=300, derandomize=True, deadline=None)

HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
UIDS = st.builds(lambda n: str(uuid.UUID(int=n)), st.integers(0, 2**128 - 1))
JOBS = st.integers(1, 10**12 - 1).map(str)


@dataclass
class Layout:
    """A cgroup path with what it encodes; `needs` is the first component that must be shown for a fact
    to be readable (the scope itself, or the parent that makes a bare id a container)."""

    parts: list[str] = field(default_factory=list)
    containers: list[tuple[int, str | None, str]] = field(default_factory=list)  # (needs, runtime, id)
    pod: tuple[int, str, int] | None = None  # (needs, uid, index of the pod's own container in containers)
    slurm: tuple[int, str, str | None] | None = None  # (needs, job, step)
    blind: set[int] = field(default_factory=set)  # no reader's view starts here (see MISPLACED)

    def add_noise(self, noise: list[tuple[list[str], int | None]]) -> None:
        for parts, blind in noise:
            if blind is not None:
                self.blind.add(len(self.parts) + blind)
            self.parts += parts


@st.composite
def container(draw, layout: Layout) -> None:
    cid = draw(HEX64)
    shape = draw(st.sampled_from(["docker-scope", "docker-dir", "podman", "podman-dir", "containerd", "crio"]))
    at = len(layout.parts)
    parts, runtime, needs = {
        "docker-scope": (["system.slice", f"docker-{cid}.scope"], "docker", at + 1),
        "docker-dir": (["docker", cid], "docker", at),
        "podman": (["machine.slice", f"libpod-{cid}.scope"], "podman", at + 1),
        "podman-dir": (["libpod_parent", f"libpod-{cid}"], "podman", at),
        "containerd": ([f"cri-containerd-{cid}.scope"], "containerd", at),
        "crio": ([f"crio-{cid}.scope"], "cri-o", at),
    }[shape]
    layout.parts += parts
    layout.containers.append((needs, runtime, cid))


@st.composite
def pod(draw, layout: Layout) -> None:
    uid, cid = draw(UIDS), draw(HEX64)
    qos = draw(st.sampled_from(["burstable", "besteffort", ""]))
    kubelet_root = draw(st.booleans())  # kind: the kubelet's cgroup root /kubelet
    at = len(layout.parts)
    if draw(st.booleans()):  # systemd driver
        names = [("kubelet-" if kubelet_root else "") + "kubepods"]
        names += [f"{names[0]}-{qos}"] if qos else []
        runtime, scope = draw(st.sampled_from([("containerd", "cri-containerd"), ("cri-o", "crio"),
                                               ("docker", "docker")]))
        parts = (["kubelet.slice"] if kubelet_root else []) + [f"{n}.slice" for n in names]
        parts += [f"{names[-1]}-pod{uid.replace('-', '_')}.slice", f"{scope}-{cid}.scope"]
    else:  # cgroupfs driver: the runtime is not named, and the id is a container only under its pod
        runtime = None
        parts = (["kubelet"] if kubelet_root else []) + ["kubepods"] + ([qos] if qos else [])
        parts += [f"pod{uid}", cid]
    pod_at = at + len(parts) - 2
    layout.parts += parts
    layout.pod = (pod_at, uid, len(layout.containers))
    layout.containers.append((pod_at if runtime is None else pod_at + 1, runtime, cid))


@st.composite
def slurm(draw, layout: Layout) -> None:
    job = draw(JOBS)
    step = draw(st.sampled_from([None, "0", "7", "batch", "extern", "interactive"]))
    at = len(layout.parts)
    if draw(st.booleans()):
        parts = ["system.slice", draw(st.sampled_from(["slurmstepd.scope", "gpu-07_slurmstepd.scope"]))]
        needs = at + 1
    else:
        parts, needs = ["slurm", "uid_1000"], at
    parts += [f"job_{job}"] + ([f"step_{step}", "user", "task_0"] if step else [])
    layout.parts += parts
    layout.slurm = (needs, job, step)


# Names that are no layout's, though they look like one: none may make a fact, wherever they stand.
LOOKALIKES = st.one_of(
    HEX64.map(lambda h: f"mydocker-{h}.scope"), HEX64.map(lambda h: f"docker-{h[:12]}.scope"),
    HEX64.map(lambda h: f"crio-conmon-{h}.scope"), HEX64.map(lambda h: f"libpod-conmon-{h}.scope"),
    HEX64.map(lambda h: f"docker-{h}.scope.d"), HEX64, UIDS.map(lambda u: f"pod-{u}"),
    UIDS.map(lambda u: f"kubepods-burstable-pod{u}.slice"), UIDS.map(lambda u: f"mypod{u}"),
    st.sampled_from(["docker.service", "containerd.service", "init.scope", "container", "user", "task_0",
                     "session-3.scope", "slurmstepd.scope", "kubepods-burstable.slice", "system.slice"]),
)

# A pod's own name under a parent the kubelet never gives it: no pod while that parent is shown. A view
# that starts at it cannot tell (the name is all there is), so none starts there: its blind offset.
MISPLACED = st.one_of(
    UIDS.map(lambda u: (["system.slice", f"kubepods-burstable-pod{u.replace('-', '_')}.slice"], 1)),
    UIDS.map(lambda u: (["kubepods-besteffort.slice", f"kubepods-burstable-pod{u.replace('-', '_')}.slice"], 1)),
    UIDS.map(lambda u: (["kubepods.slice", f"kubelet-kubepods-pod{u.replace('-', '_')}.slice"], 1)),
    UIDS.map(lambda u: (["mypods", f"pod{u}"], 1)),
    UIDS.map(lambda u: (["kubepods", "guaranteed", f"pod{u}"], 2)),
)
NOISE = st.lists(LOOKALIKES.map(lambda name: ([name], None)) | MISPLACED, max_size=2)


@st.composite
def layouts(draw) -> Layout:
    layout = Layout()
    for part in (container, pod, container, slurm):  # outer runtime, pod, inner runtime, a Slurm job
        layout.add_noise(draw(NOISE))
        if draw(st.booleans()):
            draw(part(layout))
    layout.add_noise(draw(NOISE))
    return layout


@st.composite
def views(draw, layout: Layout) -> tuple[str, int]:
    """(the path a reader sees, the index of its first shown component): its namespace root shares the
    first k components, then goes its own way for `climb` more (none: the root is an ancestor)."""
    k = draw(st.sampled_from([i for i in range(len(layout.parts) + 1) if i not in layout.blind]))
    climb = draw(st.integers(0, 4)) if k < len(layout.parts) else draw(st.integers(1, 4))
    return "/" + "/".join([".."] * climb + layout.parts[k:]), k


def expected(layout: Layout, shown_from: int) -> CgroupFacts:
    """What a reader that sees the components from shown_from on must name: every fact whose components
    it sees, and for the container, the innermost one (outer ones are above it, so hidden first)."""
    seen = [c for c in layout.containers if c[0] >= shown_from]
    inner = seen[-1] if seen else None
    pod = layout.pod if layout.pod and layout.pod[0] >= shown_from else None
    job = layout.slurm if layout.slurm and layout.slurm[0] >= shown_from else None
    own = pod is not None and inner is layout.containers[pod[2]] and layout.slurm is None
    return CgroupFacts(inner[1] if inner else None, inner[2] if inner else None, pod[1] if pod else None,
                       job[1] if job else None, job[2] if job else None, own)


@st.composite
def seen_layouts(draw) -> tuple[Layout, str, int]:
    layout = draw(layouts())
    path, shown_from = draw(views(layout))
    return layout, path, shown_from


@SETTINGS
@given(seen=seen_layouts(), v1_too=st.booleans())
def test_every_fact_named_is_the_paths_own_and_none_that_is_shown_is_missed(seen, v1_too):
    layout, path, shown_from = seen
    text = f"0::{path}\n" + (f"4:memory:{path}\n1:name=systemd:{path}\n" if v1_too else "")
    assert parse_cgroup(text) == expected(layout, shown_from)


def _env(draw, truth_uid: str | None, truth_job: str | None) -> dict[str, str]:
    """One variable of each kind at most, each this process's own value or another's."""
    env: dict[str, str] = {}
    for keys, own, other in ((POD_UID_KEYS, truth_uid, UIDS), (POD_NAMESPACE_KEYS, "ml", st.just("cv")),
                             (POD_NAME_KEYS, "train-7f-5d9c8", st.just("train-7f")),
                             (("SLURM_JOB_ID",), truth_job, JOBS), (("SLURM_JOB_ACCOUNT",), "nlp", st.just("cv"))):
        if draw(st.booleans()):
            env[draw(st.sampled_from(keys))] = own if own and draw(st.booleans()) else draw(other)
    return env


@SETTINGS
@given(seen=seen_layouts(), data=st.data(), complete=st.booleans())
def test_the_environment_adds_names_only_where_it_agrees_with_the_cgroup(seen, data, complete):
    layout, path, _ = seen
    facts = parse_cgroup(f"0::{path}\n")
    env = _env(data.draw, facts.pod_uid, facts.slurm_job)
    got = owner_of(f"0::{path}\n", "Uid:\t0\t0\t0\t0\n", env, complete=complete)
    # The cgroup's facts are the owner's, whatever the environment says.
    assert (got.runtime, got.container_id, got.pod_uid) == (facts.runtime, facts.container_id, facts.pod_uid)
    env_uid = next((env[k] for k in POD_UID_KEYS if k in env), None)
    if got.namespace or got.pod:
        assert facts.pod_env and env_uid in ((facts.pod_uid, None) if complete else (facts.pod_uid,))
    env_job = env.get("SLURM_JOB_ID")
    if facts.slurm_job:
        assert got.slurm_job == facts.slurm_job
    elif got.slurm_job:  # no job in the cgroup: the environment's own, where no container has its own
        assert got.slurm_job == env_job and (facts.pod_env or not (facts.container_id or facts.pod_uid))
    if got.slurm_account:
        assert env_job == got.slurm_job or (complete and env_job is None and got.slurm_job == facts.slurm_job)


VALUES = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=24)


@st.composite
def environments(draw) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(ENV_KEYS) | st.from_regex(r"[A-Z_]{1,12}", fullmatch=True),
                         unique=True, max_size=12))
    return {k: draw(st.sampled_from(["4242917", "train-7f-5d9c8", "ml"]) | VALUES) for k in keys}


@SETTINGS
@given(env=environments(), data=st.data())
def test_a_cut_environment_never_yields_a_cut_value(env, data):
    raw = b"".join(f"{k}={v}\0".encode() for k, v in env.items())
    cut_at = data.draw(st.integers(0, len(raw)))
    assert parse_environ(raw[:cut_at]).items() <= parse_environ(raw).items()


@SETTINGS
@given(seen=seen_layouts(), data=st.data())
def test_a_cut_environment_names_nothing_the_whole_one_would_not(seen, data):
    layout, path, _ = seen
    facts = parse_cgroup(f"0::{path}\n")
    env = _env(data.draw, facts.pod_uid, facts.slurm_job)
    order = data.draw(st.permutations(list(env)))
    raw = b"".join(f"{k}={env[k]}\0".encode() for k in order)
    cut_env = parse_environ(raw[:data.draw(st.integers(0, len(raw)))])
    whole = owner_of(f"0::{path}\n", "", env).to_dict()
    part = owner_of(f"0::{path}\n", "", cut_env, complete=False).to_dict()
    assert part.items() <= whole.items()


@SETTINGS
@given(entries=st.lists(st.tuples(st.sampled_from(ENV_KEYS[:4]) | st.from_regex(r"[A-Z_]{1,8}", fullmatch=True),
                                  VALUES), max_size=12))
def test_a_key_set_twice_reads_as_getenv_reads_it(entries):
    """execve takes any list of entries; getenv(3) returns the first entry of a name, so that is the value
    the process lives with (Python's os.environ, built by overwriting, would say the last one)."""
    raw = b"".join(f"{k}={v}\0".encode() for k, v in entries)
    first: dict[str, str] = {}
    for key, value in entries:
        first.setdefault(key, value)
    wanted = {k: v for k, v in first.items() if k in ENV_KEYS}
    assert parse_environ(raw) == wanted
