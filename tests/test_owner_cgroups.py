"""Whose stalled process is it, on real cgroups: real processes moved into cgroups named like docker,
kubepods and slurmstepd scopes; the diagnosis and the stall alert name container, pod, job and user.

The cgroups live in a test-private subtree (<cgroup2>/trainguard-test-<pid>/system.slice/...): the
host's own system.slice and kubepods.slice belong to systemd and the kubelet and are not touched. From
the root cgroup namespace /proc/PID/cgroup then shows /trainguard-test-<pid>/system.slice/...; a
reader in its own cgroup namespace sees /../system.slice/...: both are recognised, since the parser
matches the runtimes' path components wherever they sit. Needs root and a cgroup v2 hierarchy (the
v1 Slurm layout also needs a v1 pids hierarchy, as on a hybrid host)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap

import pytest
from trainguard.diagnosis.render import render
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import Finding, Severity, Snapshot
from trainguard.sources.gpu import GpuSampler

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec
from tests.support.cgroups import CgroupTree, cgroup1_root, cgroup2_root, cgroup_reason

CID_DOCKER = "4d2a0f6b" * 8
CID_POD = "c0ffee00" * 8
POD_UID = "3c5e9f7a-5b1d-4c2e-9f3a-1b2c3d4e5f60"
LAYOUTS = {
    "docker": f"system.slice/docker-{CID_DOCKER}.scope",
    "pod": ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID_POD}.scope"),
    "slurm": "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
    "unknown": "system.slice/docker.service",  # dockerd's own unit: no container
    "near_miss": f"system.slice/crio-conmon-{CID_POD}.scope",  # CRI-O's monitor, not the container
    "lookalike": f"system.slice/mydocker-{CID_DOCKER}.scope",  # an id inside a name that is no runtime's
}
ENVS = {
    "docker": {"POD_NAMESPACE": "ml", "POD_NAME": "not-a-pod"},  # no pod without the kubepods path
    "pod": {"POD_NAMESPACE": "ml", "POD_NAME": "train-7f"},
    "slurm": {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_USER": "alice"},
    "unknown": {},
    "near_miss": {},
    "lookalike": {},
}
SLEEPER = [shutil.which("sleep") or "/bin/sleep", "600"]  # runnable by any user (the interpreter may not be)


def _nobody() -> tuple[int, str]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_name
    except KeyError:
        return 0, pwd.getpwuid(0).pw_name


@pytest.fixture
def placed():
    if reason := cgroup_reason(2):
        pytest.skip(reason)
    tree = CgroupTree(cgroup2_root())
    uid, name = _nobody()
    children: dict[str, subprocess.Popen] = {}
    try:
        for layout, relpath in LAYOUTS.items():
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **ENVS[layout]}
            child = subprocess.Popen(SLEEPER, env=env, user=uid,
                                     stdin=subprocess.DEVNULL)
            children[layout] = child
            tree.place(child.pid, relpath)
        yield tree, children, name
    finally:
        tree.release()  # out of the test cgroups first, then ended, then the cgroups removed
        for child in children.values():
            child.kill()
            child.wait(timeout=10)
        tree.close()
        assert not tree.base.exists()


def _gpu_holding(pids):
    clock = FakeClock()
    procs = [{"pid": pid, "used": GiB} for pid in pids]
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                                     "processes": procs}])]}, clock=clock)
    sampler = GpuSampler(nvml, clock=clock, xid_events=False)
    try:
        return clock, sampler.sample().gpus[0]
    finally:
        sampler.close()


def test_diagnosis_names_container_pod_job_and_user(placed):
    tree, children, user = placed
    for layout, child in children.items():  # what the kernel shows, from the root cgroup namespace
        with open(f"/proc/{child.pid}/cgroup") as fh:
            assert f"0::{tree.relative(LAYOUTS[layout])}\n" in fh.read()
    clock, gpu = _gpu_holding([c.pid for c in children.values()])
    d = StallDiagnoser(py_spy=False, clock=clock).diagnose(gpu, Snapshot(ts=clock.now, gpus=(gpu,)), clock.now)
    owners = {v.host_pid: v.owner for v in d.processes}
    uid = os.stat(f"/proc/{children['docker'].pid}").st_uid
    assert owners[children["docker"].pid] == {"runtime": "docker", "container_id": CID_DOCKER, "user": user,
                                              "uid": uid}
    assert owners[children["pod"].pid] == {"runtime": "containerd", "container_id": CID_POD, "pod_uid": POD_UID,
                                           "namespace": "ml", "pod": "train-7f", "user": user, "uid": uid}
    assert owners[children["slurm"].pid] == {"slurm_job": "4242", "slurm_step": "0", "slurm_account": "nlp",
                                             "slurm_user": "alice", "user": user, "uid": uid}
    # Unknown layouts give nothing but the user: no container, pod or job is guessed.
    assert owners[children["unknown"].pid] == {"user": user, "uid": uid}
    assert owners[children["near_miss"].pid] == {"user": user, "uid": uid}
    assert owners[children["lookalike"].pid] == {"user": user, "uid": uid}
    # One rule for one fact: the process line's container is the owner's, on every process.
    assert all(v.container_id == v.owner.get("container_id") for v in d.processes)
    lookalike_line = next(line for line in render(d).splitlines() if f"PID {children['lookalike'].pid}" in line)
    assert "container" not in lookalike_line
    assert d.to_dict()["processes"][1]["owner"]["pod"] == "train-7f"  # diagnose --json


def test_stall_alert_names_the_owner_in_en_and_zh(placed):
    tree, children, user = placed
    clock, gpu = _gpu_holding([children["pod"].pid, children["slurm"].pid])
    snapshot = Snapshot(ts=clock.now, gpus=(gpu,))
    stall = Finding("gpu.stall:0", Severity.CRITICAL, "GPU 0 stalled",
                    details={"gpu": 0, "util_recent": [0.0], "stalled_for_s": 900.0, "memory_used_bytes": 76 * GiB,
                             "memory_total_bytes": 80 * GiB, "util_mean_ratio": 0.0})
    (enriched,) = StallDiagnoser(py_spy=False, clock=clock).enrich([stall], snapshot, clock.now)
    assert [o.get("pod") or o.get("slurm_job") for o in enriched.details["owners"]] == ["train-7f", "4242"]
    en = texts_for(enriched, tr("en")).what
    assert f"pod ml/train-7f (user {user})" in en and f"Slurm job 4242 (user {user}, account nlp)" in en
    zh = texts_for(enriched, tr("zh")).what
    assert "pod ml/train-7f（用户" in zh and "Slurm 作业 4242" in zh


READER = textwrap.dedent("""
    import json, sys
    from trainguard.sources.owner import read_owner
    out = {}
    for pid in sys.argv[1:]:
        with open(f"/proc/{pid}/cgroup") as fh:
            seen = [l for l in fh.read().splitlines() if l.startswith("0::")][0]
        out[pid] = [seen, read_owner("/proc", int(pid)).to_dict()]
    print(json.dumps(out))
""")


def test_a_reader_in_its_own_cgroup_namespace_sees_the_same_owners(placed):
    tree, children, _user = placed
    if subprocess.run(["unshare", "--help"], capture_output=True).returncode != 0:
        pytest.skip("unshare (util-linux) is not installed")
    reader_cgroup = tree.make("reader")  # a leaf of its own: its namespace's root
    daemon_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemon")
    pids = [str(children[k].pid) for k in ("docker", "pod", "slurm", "unknown")]

    def enter() -> None:  # runs in the child before exec: into the leaf, then unshare makes the namespace
        (reader_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run(["unshare", "--cgroup", sys.executable, "-c", READER, *pids], preexec_fn=enter,
                         env={**os.environ, "PYTHONPATH": daemon_dir}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    docker_line, docker = seen[pids[0]]
    assert docker_line == f"0::/../system.slice/docker-{CID_DOCKER}.scope"  # relative to the reader's root
    assert docker["container_id"] == CID_DOCKER
    assert seen[pids[1]][1]["pod"] == "train-7f" and seen[pids[2]][1]["slurm_job"] == "4242"
    assert set(seen[pids[3]][1]) == {"user", "uid"}


def test_slurm_v1_layout_on_a_v1_hierarchy():
    if reason := cgroup_reason(1):
        pytest.skip(reason)
    tree = CgroupTree(cgroup1_root())
    child = subprocess.Popen(SLEEPER, env={"SLURM_JOB_ACCOUNT": "cv"},
                             stdin=subprocess.DEVNULL)
    try:
        tree.place(child.pid, "slurm/uid_0/job_4243/step_batch")
        clock, gpu = _gpu_holding([child.pid])
        d = StallDiagnoser(py_spy=False, clock=clock).diagnose(gpu, Snapshot(ts=clock.now, gpus=(gpu,)), clock.now)
        owner = d.processes[0].owner
        # The job and step from the v1 path; the account from the process's own environment.
        assert (owner["slurm_job"], owner["slurm_step"], owner.get("slurm_account")) == ("4243", "batch", "cv")
    finally:
        tree.release()
        child.kill()
        child.wait(timeout=10)
        tree.close()
    assert not tree.base.exists()
