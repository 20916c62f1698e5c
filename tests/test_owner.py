"""Whose process is it: the owner parsers on /proc/PID/cgroup, status and environ text as hosts write it.

The cgroup samples follow what the runtimes create: docker (systemd and cgroupfs drivers), the
kubelet's kubepods hierarchy with containerd and CRI-O, podman (root and rootless, crun's
"container" sub-cgroup), slurmstepd's cgroup/v2 and cgroup/v1 trees. Near-misses that look alike
(dockerd's own service, conmon's scope, a short id, a QoS slice without a pod, slurmstepd without a
job) must give nothing."""

from __future__ import annotations

import pwd
import subprocess
import sys
import time

import pytest
from trainguard.sources import owner
from trainguard.sources.owner import CgroupFacts, Owner, owner_of, parse_cgroup, parse_environ, parse_uid

CID = "9f1c6d9e3b2a4c5d8e7f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5"
POD_UID = "3c5e9f7a-5b1d-4c2e-9f3a-1b2c3d4e5f60"
POD_SLICE_UID = POD_UID.replace("-", "_")

DOCKER_V1 = f"""12:hugetlb:/docker/{CID}
11:memory:/docker/{CID}
10:cpu,cpuacct:/docker/{CID}
9:devices:/docker/{CID}
8:pids:/docker/{CID}
1:name=systemd:/docker/{CID}
0::/system.slice/containerd.service
"""
DOCKER_V2 = f"0::/system.slice/docker-{CID}.scope\n"
CONTAINERD_POD_V2 = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice/"
                     f"cri-containerd-{CID}.scope\n")
GUARANTEED_POD_V2 = f"0::/kubepods.slice/kubepods-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope\n"
CRIO_POD_V1 = f"""11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SLICE_UID}.slice/crio-{CID}.scope
5:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SLICE_UID}.slice/crio-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SLICE_UID}.slice/crio-{CID}.scope
"""
CGROUPFS_POD_V1 = f"""11:cpuset:/kubepods/besteffort/pod{POD_UID}/{CID}
4:memory:/kubepods/besteffort/pod{POD_UID}/{CID}
1:name=systemd:/kubepods/besteffort/pod{POD_UID}/{CID}
"""
PODMAN_ROOTLESS_V2 = f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n"
PODMAN_CGROUPFS_V1 = f"3:memory:/libpod_parent/libpod-{CID}\n"
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
SLURM_V2_BATCH = "0::/system.slice/gpu-node-7_slurmstepd.scope/job_4243/step_batch/user/task_0\n"
SLURM_V1 = """12:pids:/
11:memory:/slurm/uid_1000/job_4242/step_0/task_0
7:devices:/slurm/uid_1000/job_4242/step_0
4:freezer:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
"""


@pytest.mark.parametrize("text,expected", [
    (DOCKER_V1, CgroupFacts("docker", CID)),
    (DOCKER_V2, CgroupFacts("docker", CID)),
    (CONTAINERD_POD_V2, CgroupFacts("containerd", CID, POD_UID, pod_env=True)),
    (GUARANTEED_POD_V2, CgroupFacts("containerd", CID, POD_UID, pod_env=True)),
    (CRIO_POD_V1, CgroupFacts("cri-o", CID, POD_UID, pod_env=True)),
    (CGROUPFS_POD_V1, CgroupFacts(None, CID, POD_UID, pod_env=True)),  # cgroupfs driver: runtime not named
    (PODMAN_ROOTLESS_V2, CgroupFacts("podman", CID)),
    (f"0::/machine.slice/libpod-{CID}.scope/container\n", CgroupFacts("podman", CID)),
    (PODMAN_CGROUPFS_V1, CgroupFacts("podman", CID)),
    (SLURM_V2, CgroupFacts(slurm_job="4242", slurm_step="0")),
    (SLURM_V2_BATCH, CgroupFacts(slurm_job="4243", slurm_step="batch")),
    (SLURM_V1, CgroupFacts(slurm_job="4242", slurm_step="0")),
    ("0::/system.slice/slurmstepd.scope/job_77\n", CgroupFacts(slurm_job="77")),
    # A reader in another cgroup namespace: its root is somewhere inside, or the path climbs out of it.
    (f"0::/trainguard-test-12/system.slice/docker-{CID}.scope\n", CgroupFacts("docker", CID)),
    ("0::/../../system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", CgroupFacts(slurm_job="4242",
                                                                                          slurm_step="0")),
    # A pod with a QoS slice under another parent than its name says is no pod; its container still is one.
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice/"
     f"cri-containerd-{CID}.scope\n", CgroupFacts("containerd", CID)),
])
def test_known_layouts(text, expected):
    assert parse_cgroup(text) == expected


IN_POD = CgroupFacts("containerd", CID, POD_UID, pod_env=True)


@pytest.mark.parametrize("text,expected", [
    # What a DaemonSet pod (its own cgroup namespace, rooted at its container) sees of other pods, systemd
    # driver: a pod of its QoS class, of another class, guaranteed (no QoS slice) from burstable and alike.
    (f"0::/../../kubepods-burstable-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope\n", IN_POD),
    (f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SLICE_UID}.slice/"
     f"cri-containerd-{CID}.scope\n", IN_POD),
    (f"0::/../../../kubepods-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope\n", IN_POD),
    (f"0::/../../kubepods-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope\n", IN_POD),
    (f"0::/../../../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice/"
     f"crio-{CID}.scope\n", CgroupFacts("cri-o", CID, POD_UID, pod_env=True)),
    # The cgroupfs driver: the same three, as directories.
    (f"0::/../../pod{POD_UID}/{CID}\n", CgroupFacts(None, CID, POD_UID, pod_env=True)),
    (f"0::/../../../besteffort/pod{POD_UID}/{CID}\n", CgroupFacts(None, CID, POD_UID, pod_env=True)),
    (f"11:memory:/../../../pod{POD_UID}/{CID}\n", CgroupFacts(None, CID, POD_UID, pod_env=True)),
    # A sibling container of the reader's own pod: the pod slice was climbed over, so no pod is named.
    (f"0::/../cri-containerd-{CID}.scope\n", CgroupFacts("containerd", CID)),
    # The container's own sub-cgroups (systemd inside it, crun's "container") are still its environment.
    (f"0::/../../kubepods-burstable-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope/init.scope\n", IN_POD),
])
def test_relative_paths_from_a_cgroup_namespace(text, expected):
    assert parse_cgroup(text) == expected


NODE = "0b5e55ed" * 8  # the outer container: a kind node, a Docker-in-Docker host
KIND_POD = ("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope")


@pytest.mark.parametrize("text,expected", [
    (f"0::/system.slice/docker-{NODE}.scope/{KIND_POD}\n", IN_POD),  # kind, the kubelet's cgroup root /kubelet
    (f"0::/docker/{NODE}/{KIND_POD}\n", IN_POD),
    (f"0::/../../../kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_SLICE_UID}.slice/"
     f"cri-containerd-{CID}.scope\n", IN_POD),  # from another pod of the kind node
    (f"0::/system.slice/docker-{NODE}.scope/docker/{CID}\n", CgroupFacts("docker", CID)),  # Docker-in-Docker
    (f"0::/system.slice/docker-{NODE}.scope/system.slice/docker-{CID}.scope\n", CgroupFacts("docker", CID)),
    (f"1:name=systemd:/docker/{NODE}/docker/{CID}\n", CgroupFacts("docker", CID)),
    # Docker inside a pod's container: the pod is certain, its downward API variables are not this
    # process's (the inner runtime set its environment); the same for a Slurm job run inside a pod.
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice/"
     f"cri-containerd-{NODE}.scope/docker/{CID}\n", CgroupFacts("docker", CID, POD_UID)),
    (f"0::/../../kubepods-burstable-pod{POD_SLICE_UID}.slice/cri-containerd-{CID}.scope/system.slice/"
     "slurmstepd.scope/job_4242/step_0/user/task_0\n", CgroupFacts("containerd", CID, POD_UID, "4242", "0")),
])
def test_nested_runtimes_name_the_innermost_container(text, expected):
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize("text", [
    "0::/\n",
    "0::/init.scope\n",
    "0::/system.slice/docker.service\n",  # dockerd itself
    "0::/system.slice/containerd.service\n",
    f"0::/system.slice/crio-conmon-{CID}.scope\n",  # CRI-O's monitor process, not the container
    f"0::/machine.slice/libpod-conmon-{CID}.scope\n",
    f"0::/system.slice/docker-{CID[:12]}.scope\n",  # a short id is no id
    f"0::/system.slice/docker-{CID.upper()}.scope\n",
    f"0::/system.slice/{CID}\n",  # a bare id under no known parent
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "0::/kubepods.slice/kubepods-burstable.slice\n",  # a QoS slice, no pod
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podnot-a-uid.slice\n",
    f"0::/mypods/pod{POD_UID}/{CID}\n",  # pod<uid> not under kubepods
    f"0::/system.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice\n",  # pod slice outside kubepods.slice
    "0::/system.slice/slurmstepd.scope\n",  # slurmstepd itself, no job
    "0::/system.slice/slurmstepd.scope/job_abc/step_0\n",
    "0::/system.slice/slurmd.service\n",
    "11:memory:/slurm/uid_1000\n",
    "11:memory:/slurm/job_4242/step_0\n",  # v1 layout without its uid_ level
    f"0::/system.slice/mydocker-{CID}.scope\n",  # an id inside another name
    f"0::/system.slice/docker-{CID}.scope.d\n",
    f"12:memory:/kubepods/burstable/pod1/{CID}\n",  # "pod1" is no pod uid: the id under it is no container
    f"0::/../{CID}\n",  # a bare id whose parent was climbed over: docker's? a pod's? something else's
    f"0::/../mypods/pod{POD_UID}/{CID}\n",
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID}.slice\n",  # "-": not kubelet's
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice\n",
    f"0::/system.slice/../docker-{CID}.scope\n",  # no kernel writes ".." inside a path
    "garbage\nno colons here\n12:memory\n",
    "",
])
def test_near_misses_give_nothing(text):
    assert parse_cgroup(text) == CgroupFacts()


def test_uid_is_the_real_one():
    status = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n"
    assert parse_uid(status) == 1000
    assert parse_uid("Name:\tx\n") is None


def test_environ_keeps_only_the_named_keys():
    data = b"HOME=/root\0AWS_SECRET_ACCESS_KEY=abc/def\0SLURM_JOB_ID=4242\0SLURM_JOB_ACCOUNT=nlp\0WANDB_API_KEY=k\0"
    assert parse_environ(data) == {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "nlp"}


@pytest.mark.parametrize("data,expected", [
    (b"SLURM_JOB_ACCOUNT=nlp\0SLURM_JOB_ID=4242", {"SLURM_JOB_ACCOUNT": "nlp"}),  # "4242917" cut by the limit
    (b"POD_NAMESPACE=ml\0POD_NAME=train-7f", {"POD_NAMESPACE": "ml"}),  # "train-7f-5d9c8"
    (b"POD_NAME=train-7f-5d9c8\0SLURM_JOB_", {"POD_NAME": "train-7f-5d9c8"}),  # the cut fell in the next key
    (b"POD_NAME=tr\xc3", {}),  # inside a character
    (b"POD_NAME=train-7f-5d9c8\0", {"POD_NAME": "train-7f-5d9c8"}),  # the limit fell on an entry's end
])
def test_an_entry_the_read_limit_cut_is_dropped(data, expected):
    assert parse_environ(data) == expected


def _passwd(uid: int) -> pwd.struct_passwd:
    if uid == 1000:
        return pwd.struct_passwd(("alice", "x", 1000, 1000, "", "/home/alice", "/bin/bash"))
    raise KeyError(uid)


STATUS_1000 = "Uid:\t1000\t1000\t1000\t1000\n"


def test_pod_name_from_downward_api_only_inside_a_pod():
    env = {"POD_NAMESPACE": "ml", "POD_NAME": "train-7f"}
    in_pod = owner_of(CONTAINERD_POD_V2, STATUS_1000, env, _passwd)
    assert in_pod == Owner("containerd", CID, POD_UID, "ml", "train-7f", user="alice", uid=1000)
    # The same variables in a plain docker container do not make it a pod.
    assert owner_of(DOCKER_V2, STATUS_1000, env, _passwd) == Owner("docker", CID, user="alice", uid=1000)
    # Values that are no Kubernetes names are dropped, not passed on to labels and titles.
    bad = owner_of(CONTAINERD_POD_V2, STATUS_1000, {"POD_NAMESPACE": "ML Team", "POD_NAME": "x;rm"}, _passwd)
    assert bad.namespace is None and bad.pod is None and bad.pod_uid == POD_UID


def test_pod_variables_that_contradict_the_cgroup_are_not_used():
    env = {"POD_NAMESPACE": "ml", "POD_NAME": "train-7f", "POD_UID": POD_UID}
    assert owner_of(CONTAINERD_POD_V2, STATUS_1000, env, _passwd).pod == "train-7f"  # the uid agrees
    other_pod = {**env, "POD_UID": "0badc0de-5b1d-4c2e-9f3a-1b2c3d4e5f60"}
    got = owner_of(CONTAINERD_POD_V2, STATUS_1000, other_pod, _passwd)
    assert (got.pod_uid, got.namespace, got.pod) == (POD_UID, None, None)
    # Docker inside the pod's container: the inner runtime made this environment, not the kubelet.
    dind = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE_UID}.slice/"
            f"cri-containerd-{'0b5e55ed' * 8}.scope/docker/{CID}\n")
    assert owner_of(dind, STATUS_1000, env, _passwd) == Owner("docker", CID, POD_UID, user="alice", uid=1000)


def test_a_cut_environment_adds_only_what_it_confirms():
    # The read stopped at the limit: an entry saying another pod or job may be in the part not read.
    ns = {"POD_NAMESPACE": "ml", "POD_NAME": "train-7f"}
    assert owner_of(CONTAINERD_POD_V2, STATUS_1000, ns, _passwd, complete=False).pod is None
    assert owner_of(CONTAINERD_POD_V2, STATUS_1000, {**ns, "POD_UID": POD_UID}, _passwd, complete=False).pod == \
        "train-7f"
    assert owner_of(SLURM_V2, STATUS_1000, {"SLURM_JOB_ACCOUNT": "nlp"}, _passwd, complete=False).slurm_account is None
    assert owner_of(SLURM_V2, STATUS_1000, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_ID": "4242"}, _passwd,
                    complete=False).slurm_account == "nlp"


def test_a_plain_containers_environment_names_no_job():
    # Found by the generated layouts (tests/test_owner_properties.py): owner_of read what read_owner skips.
    assert owner_of(DOCKER_V2, STATUS_1000, {"SLURM_JOB_ID": "1"}, _passwd).slurm_job is None


def test_slurm_job_account_and_user():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_USER": "alice"}
    got = owner_of(SLURM_V2, STATUS_1000, env, _passwd)
    assert (got.slurm_job, got.slurm_step, got.slurm_account, got.slurm_user, got.user) == \
        ("4242", "0", "nlp", "alice", "alice")
    # Another job's variables (inherited by a process moved into this job) do not lend it their account.
    other = owner_of(SLURM_V2, STATUS_1000, {**env, "SLURM_JOB_ID": "99"}, _passwd)
    assert other.slurm_job == "4242" and other.slurm_account is None and other.slurm_user is None
    # No Slurm cgroup plugin: the job's own variables still say it.
    bare = owner_of("0::/user.slice/user-1000.slice/session-3.scope\n", STATUS_1000,
                    {**env, "SLURM_STEP_ID": "2"}, _passwd)
    assert (bare.slurm_job, bare.slurm_step, bare.slurm_account) == ("4242", "2", "nlp")


def test_unknown_uid_falls_back_to_its_number():
    assert owner_of("0::/\n", "Uid:\t4000123\t4000123\t4000123\t4000123\n", {}, _passwd) == \
        Owner(user="4000123", uid=4000123)
    assert owner_of("0::/\n", "", {}).to_dict() == {}


def test_environ_is_read_only_where_it_can_say_something(tmp_path):
    proc = tmp_path / "7"
    proc.mkdir()
    (proc / "status").write_text(STATUS_1000)
    (proc / "environ").write_bytes(b"SLURM_JOB_ID=4242\0SLURM_JOB_ACCOUNT=nlp\0X=" + b"y" * owner.ENVIRON_LIMIT)
    (proc / "cgroup").write_text(DOCKER_V2)
    got = owner.read_owner(str(tmp_path), 7)  # a plain container: its environment is left alone
    assert got.container_id == CID and got.runtime == "docker" and got.slurm_job is None
    (proc / "cgroup").write_text(SLURM_V2)
    assert owner.read_owner(str(tmp_path), 7).slurm_account == "nlp"
    assert owner.read_owner(str(tmp_path), 8).to_dict() == {}  # gone


@pytest.mark.parametrize("facts,en,zh", [
    ({"namespace": "ml", "pod": "train-7f", "pod_uid": POD_UID, "container_id": CID, "runtime": "containerd",
      "user": "alice", "slurm_job": "4242"}, "pod ml/train-7f (user alice, Slurm job 4242)",
     "pod ml/train-7f（用户 alice、Slurm 作业 4242）"),
    ({"pod_uid": POD_UID, "container_id": CID}, f"pod {POD_UID}", f"pod {POD_UID}"),
    ({"runtime": "docker", "container_id": CID, "user": "root"}, f"docker container {CID[:12]} (user root)",
     f"docker 容器 {CID[:12]}（用户 root）"),
    ({"container_id": CID}, f"container {CID[:12]}", f"容器 {CID[:12]}"),
    ({"slurm_job": "4242", "slurm_account": "nlp", "user": "alice"}, "Slurm job 4242 (user alice, account nlp)",
     "Slurm 作业 4242（用户 alice、账户 nlp）"),
    ({"user": "alice", "uid": 1000}, "user alice", "用户 alice"),
    ({}, "", ""),
])
def test_owner_is_said_short_in_english_and_chinese(facts, en, zh):
    from trainguard.diagnosis.words import owner_text
    from trainguard.i18n import tr

    assert owner_text(facts, tr("en")) == en
    assert owner_text(facts, tr("zh")) == zh


def test_diagnose_screen_has_an_owner_line():
    from trainguard.diagnosis.model import Diagnosis, ProcessView
    from trainguard.diagnosis.render import render

    owner = {"runtime": "containerd", "container_id": CID, "pod_uid": POD_UID, "namespace": "ml", "pod": "train-7f",
             "user": "alice", "uid": 1000}
    view = ProcessView(4242, 4242, True, "", "python train.py", CID, "S", None, (), 3, None, {}, (), owner=owner)
    d = Diagnosis(0, "A100", None, None, (), None, (view,), (), "v", "r")
    text = render(d)
    assert (f"    owner: pod ml/train-7f (user alice) [runtime=containerd, container_id={CID[:36]}, "
            f"pod_uid={POD_UID}, uid=1000]") in text
    assert "    归属：pod ml/train-7f（用户 alice）" in render(d, "zh")
    assert d.to_dict()["processes"][0]["owner"] == owner and d.owners() == [owner]


def test_a_duplicated_variable_reads_as_the_process_itself_reads_it(tmp_path):
    """A real process started with SLURM_JOB_ID twice in its environment (execve allows it): the daemon's
    reading agrees with what getenv(3) returns inside that process, for both readers of /proc/PID/environ."""
    from trainguard.sources.owner import read_environ
    from trainguard.sources.procs import read_environ as read_named

    seen = tmp_path / "getenv"
    child_code = ("import ctypes, sys, time; libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p; "
                  f"open({str(seen)!r}, 'wb').write(libc.getenv(b'SLURM_JOB_ID')); time.sleep(60)")
    launcher = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None)\n"
        "def array(items):\n"
        "    out = (ctypes.c_char_p * (len(items) + 1))(*items, None)\n"
        "    return out\n"
        f"argv = array([sys.executable.encode(), b'-c', {child_code!r}.encode()])\n"
        "envp = array([b'SLURM_JOB_ID=111', b'PATH=/usr/bin:/bin', b'SLURM_JOB_ID=222'])\n"
        "libc.execve(sys.executable.encode(), argv, envp)\n"
        "sys.exit('execve failed')\n")
    child = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        deadline = time.monotonic() + 30
        while not (seen.exists() and seen.read_bytes()):
            assert child.poll() is None and time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        truth = seen.read_text()
        assert truth == "111"
        assert read_environ("/proc", child.pid) == ({"SLURM_JOB_ID": truth}, True)
        assert read_named("/proc", child.pid, ("SLURM_JOB_ID",)) == {"SLURM_JOB_ID": truth}
    finally:
        child.kill()
        child.wait()
