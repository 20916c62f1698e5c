"""Whose process is it, as a DaemonSet pod sees it: real processes in real cgroups laid out like the
kubelet's (systemd and cgroupfs drivers), kind's and Docker-in-Docker's, read by a process in its own
cgroup namespace (`unshare --cgroup`) rooted at another pod's container, so the relative "/../.." paths
are the kernel's own output; and environments over the 256 KiB read limit, cut inside a value.

The cgroups live in a test-private subtree (<cgroup2>/trainguard-test-<pid>/...); no controller is
enabled. Needs root, a writable cgroup v2 hierarchy (at /sys/fs/cgroup or, on a hybrid host,
/sys/fs/cgroup/unified) and unshare from util-linux."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from trainguard.sources.owner import ENVIRON_LIMIT, read_owner

from tests.support.cgroups import CgroupTree, cgroup2_root, cgroup_reason
from tests.support.environ import cut_inside

SLEEPER = [shutil.which("sleep") or "/bin/sleep", "600"]
DAEMON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemon")


def uid(n: int) -> str:
    return f"{n:08x}-5b1d-4c2e-9f3a-1b2c3d4e5f60"


def cid(n: int) -> str:
    return f"{n:08x}" * 8


def pod_slice(qos: str, n: int, prefix: str = "") -> str:
    """<prefix>kubepods[-qos]-pod<uid>.slice under its parents, systemd driver ("" qos: guaranteed)."""
    chain = [f"{prefix}kubepods"] + ([f"{prefix}kubepods-{qos}"] if qos else [])
    return "/".join(f"{c}.slice" for c in chain) + f"/{chain[-1]}-pod{uid(n).replace('-', '_')}.slice"


# The readers: a DaemonSet pod's container (burstable, systemd driver), one on a cgroupfs-driver node.
READERS = {
    "systemd": f"{pod_slice('burstable', 1)}/cri-containerd-{cid(1)}.scope",
    "cgroupfs": f"kubepods/burstable/pod{uid(2)}/{cid(2)}",
}
POD_ENV = {"POD_NAMESPACE": "ml", "POD_NAME": "train-7f-5d9c8"}
# name -> (reader, cgroup of the process, its environment, the line that reader sees, the owner it names)
CASES = {
    "same_qos": ("systemd", f"{pod_slice('burstable', 3)}/cri-containerd-{cid(3)}.scope", POD_ENV,
                 f"/../../kubepods-burstable-pod{uid(3).replace('-', '_')}.slice/cri-containerd-{cid(3)}.scope",
                 {"runtime": "containerd", "container_id": cid(3), "pod_uid": uid(3), "namespace": "ml",
                  "pod": "train-7f-5d9c8"}),
    "other_qos": ("systemd", f"{pod_slice('besteffort', 4)}/cri-containerd-{cid(4)}.scope",
                  {**POD_ENV, "POD_UID": uid(4)},
                  f"/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{uid(4).replace('-', '_')}.slice/"
                  f"cri-containerd-{cid(4)}.scope",
                  {"runtime": "containerd", "container_id": cid(4), "pod_uid": uid(4), "namespace": "ml",
                   "pod": "train-7f-5d9c8"}),
    "guaranteed": ("systemd", f"{pod_slice('', 5)}/crio-{cid(5)}.scope", POD_ENV,
                   f"/../../../kubepods-pod{uid(5).replace('-', '_')}.slice/crio-{cid(5)}.scope",
                   {"runtime": "cri-o", "container_id": cid(5), "pod_uid": uid(5), "namespace": "ml",
                    "pod": "train-7f-5d9c8"}),
    # Its environment says another pod's uid: the pod is the cgroup's, its name is not known.
    "other_pods_env": ("systemd", f"{pod_slice('burstable', 6)}/cri-containerd-{cid(6)}.scope",
                       {**POD_ENV, "POD_UID": uid(99)},
                       f"/../../kubepods-burstable-pod{uid(6).replace('-', '_')}.slice/cri-containerd-{cid(6)}.scope",
                       {"runtime": "containerd", "container_id": cid(6), "pod_uid": uid(6)}),
    # A sibling container of the reader's own pod: the pod slice was climbed over.
    "sibling": ("systemd", f"{pod_slice('burstable', 1)}/cri-containerd-{cid(7)}.scope", POD_ENV,
                f"/../cri-containerd-{cid(7)}.scope", {"runtime": "containerd", "container_id": cid(7)}),
    "kind": ("systemd", f"system.slice/docker-{cid(8)}.scope/{pod_slice('besteffort', 9, 'kubelet-')}/"
                        f"cri-containerd-{cid(9)}.scope", POD_ENV,
             f"/../../../../system.slice/docker-{cid(8)}.scope/{pod_slice('besteffort', 9, 'kubelet-')}/"
             f"cri-containerd-{cid(9)}.scope",
             {"runtime": "containerd", "container_id": cid(9), "pod_uid": uid(9), "namespace": "ml",
              "pod": "train-7f-5d9c8"}),
    "dind_in_pod": ("systemd", f"{pod_slice('burstable', 10)}/cri-containerd-{cid(10)}.scope/docker/{cid(11)}",
                    POD_ENV, f"/../../kubepods-burstable-pod{uid(10).replace('-', '_')}.slice/"
                             f"cri-containerd-{cid(10)}.scope/docker/{cid(11)}",
                    {"runtime": "docker", "container_id": cid(11), "pod_uid": uid(10)}),
    "fs_same_qos": ("cgroupfs", f"kubepods/burstable/pod{uid(12)}/{cid(12)}", POD_ENV,
                    f"/../../pod{uid(12)}/{cid(12)}",
                    {"container_id": cid(12), "pod_uid": uid(12), "namespace": "ml", "pod": "train-7f-5d9c8"}),
    "fs_other_qos": ("cgroupfs", f"kubepods/besteffort/pod{uid(13)}/{cid(13)}", POD_ENV,
                     f"/../../../besteffort/pod{uid(13)}/{cid(13)}",
                     {"container_id": cid(13), "pod_uid": uid(13), "namespace": "ml", "pod": "train-7f-5d9c8"}),
    "fs_guaranteed": ("cgroupfs", f"kubepods/pod{uid(14)}/{cid(14)}", POD_ENV,
                      f"/../../../pod{uid(14)}/{cid(14)}",
                      {"container_id": cid(14), "pod_uid": uid(14), "namespace": "ml", "pod": "train-7f-5d9c8"}),
    # Docker-in-Docker beside the kubelet's tree, seen from the cgroupfs node's pod.
    "dind": ("cgroupfs", f"system.slice/docker-{cid(15)}.scope/docker/{cid(16)}", {},
             f"/../../../../system.slice/docker-{cid(15)}.scope/docker/{cid(16)}",
             {"runtime": "docker", "container_id": cid(16)}),
}

READER = textwrap.dedent("""
    import json, sys
    from trainguard.sources.owner import read_owner
    out = {}
    for pid in sys.argv[1:]:
        with open(f"/proc/{pid}/cgroup") as fh:
            line = [l for l in fh.read().splitlines() if l.startswith("0::")][0]
        owner = read_owner("/proc", int(pid)).to_dict()
        out[pid] = [line[3:], {k: v for k, v in owner.items() if k not in ("user", "uid")}]
    print(json.dumps(out))
""")


def _reason() -> str | None:
    if reason := cgroup_reason(2):
        return reason
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--cgroup", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --cgroup is refused here: {probe.stderr.strip()}"
    return None


@pytest.fixture
def tree():
    if reason := _reason():
        pytest.skip(reason)
    tree = CgroupTree(cgroup2_root())
    children: list[subprocess.Popen] = []
    try:
        yield tree, children
    finally:
        tree.release()  # out of the test cgroups first, then ended, then the cgroups removed
        for child in children:
            child.kill()
            child.wait(timeout=10)
        tree.close()
        assert not tree.base.exists()


def _start(tree: CgroupTree, children: list, relpath: str, env: dict[str, str]) -> int:
    child = subprocess.Popen(SLEEPER, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
                             stdin=subprocess.DEVNULL)
    children.append(child)
    tree.place(child.pid, relpath)
    return child.pid


def _read_from(tree: CgroupTree, reader: str, pids: list[int]) -> dict[str, list]:
    """What read_owner says of pids, run in a new cgroup namespace rooted at the reader's cgroup."""
    leaf = tree.make(reader)

    def enter() -> None:  # in the child before exec: into the reader's cgroup, then unshare roots it there
        (leaf / "cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run(["unshare", "--cgroup", sys.executable, "-c", READER, *map(str, pids)], preexec_fn=enter,
                         env={**os.environ, "PYTHONPATH": DAEMON_DIR}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_daemonset_pod_names_other_pods_from_its_cgroup_namespace(tree):
    tree, children = tree
    pids = {name: _start(tree, children, relpath, env) for name, (_, relpath, env, _, _) in CASES.items()}
    for reader, relpath in READERS.items():
        seen = _read_from(tree, relpath, list(pids.values()))
        for name, (case_reader, _, _, line, owner) in CASES.items():
            if case_reader == reader:
                assert seen[str(pids[name])] == [line, owner], name


def test_an_environment_cut_inside_a_value_names_no_one(tree):
    tree, children = tree
    pod = f"{pod_slice('burstable', 20)}/cri-containerd-{cid(20)}.scope"
    # The cut falls inside POD_NAME; POD_UID before it says this pod, so the namespace read is this pod's.
    cut_pod = _start(tree, children, pod, cut_inside("POD_NAME", "train-7f-5d9c8", 8,
                                                     {"POD_UID": uid(20), "POD_NAMESPACE": "ml"}))
    # Without it, a POD_UID of another pod may stand in the part not read: nothing from the environment.
    unconfirmed = _start(tree, children, pod, cut_inside("POD_NAME", "train-7f-5d9c8", 8, {"POD_NAMESPACE": "ml"}))
    # No Slurm cgroup plugin: only the environment says the job, and its id is cut after "4242".
    session = "user.slice/user-1000.slice/session-3.scope"
    cut_job = _start(tree, children, session, cut_inside("SLURM_JOB_ID", "4242917", 4, {"SLURM_JOB_ACCOUNT": "cv"}))
    whole_job = _start(tree, children, session, {"SLURM_JOB_ACCOUNT": "cv", "SLURM_JOB_ID": "4242917"})
    for pid, tail in ((cut_pod, b"\0POD_NAME=train-7f"), (cut_job, b"\0SLURM_JOB_ID=4242")):
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
        assert len(data) > ENVIRON_LIMIT and data[:ENVIRON_LIMIT].endswith(tail)  # the kernel's bytes, cut there
    named = {pid: read_owner("/proc", pid) for pid in (cut_pod, unconfirmed, cut_job, whole_job)}
    assert (named[cut_pod].pod_uid, named[cut_pod].namespace, named[cut_pod].pod) == (uid(20), "ml", None)
    assert (named[unconfirmed].pod_uid, named[unconfirmed].namespace) == (uid(20), None)
    assert (named[cut_job].slurm_job, named[cut_job].slurm_account) == (None, None)  # not job 4242, nor its account
    assert (named[whole_job].slurm_job, named[whole_job].slurm_account) == ("4242917", "cv")
    # The same from a DaemonSet pod's cgroup namespace.
    seen = _read_from(tree, READERS["systemd"], [cut_pod, cut_job])
    assert seen[str(cut_pod)][1] == {"runtime": "containerd", "container_id": cid(20), "pod_uid": uid(20),
                                     "namespace": "ml"}
    assert seen[str(cut_job)][1] == {}
