"""[gpu] act = "notify-owner": a stall alert also goes to the owner routes of its processes' owners (a
user's DingTalk robot by Slurm account, user or Kubernetes namespace), delivered to a real HTTP receiver;
another owner's route gets nothing, the default targets get everything, and nothing signals the process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from trainguard import config
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.notify.worker import OutboxNotifier
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity, Snapshot
from trainguard.store.state import StateDb

from tests.gpu_support import FakeClock, GiB
from tests.support.cgroups import CgroupTree, cgroup2_root, cgroup_reason
from tests.support.environ import cut_inside
from tests.support.http_receiver import HttpReceiver
from tests.test_gpu_diagnosis import _gpu_holding
from tests.test_owner_cgroups import _gpu_holding as _gpu_holding_all

HOST = "gpu-07"
ALICE = {"runtime": "containerd", "container_id": "c0ffee00" * 8, "namespace": "ml", "pod": "train-7f",
         "user": "alice", "uid": 1000}
BOB = {"slurm_job": "4242", "slurm_account": "cv", "user": "bob", "uid": 1001}


def _config(port: int, **gpu) -> config.Config:
    url = f"json://127.0.0.1:{port}"
    return config.parse({"gpu": {"act": "notify-owner", **gpu}, "notify": {"targets": [
        {"name": "ops", "url": f"{url}/ops", "timeout": "2s"},
        {"name": "alice", "url": f"{url}/alice", "owners": ["user=alice"], "timeout": "2s"},
        {"name": "ml-team", "url": f"{url}/ml", "owners": ["namespace=ml*"], "language": "zh", "timeout": "2s"},
        {"name": "cv-team", "url": f"{url}/cv", "owners": ["slurm_account=cv"], "timeout": "2s"},
    ]}}, "test")


def _stall(owners: list[dict], gpu: int = 0) -> Finding:
    return Finding(f"gpu.stall:{gpu}", Severity.CRITICAL, f"GPU {gpu} stalled", labels={"gpu": str(gpu)},
                   details={"gpu": gpu, "stalled_for_s": 900.0, "memory_used_bytes": 76 * GiB,
                            "memory_total_bytes": 80 * GiB, "util_mean_ratio": 0.0, "owners": owners})


def _deliver(cfg: config.Config, tmp_path, events: list[AlertEvent]) -> None:
    """Every target's worker steps once: what is due goes out now, nothing is left to timing."""
    notifier = OutboxNotifier(StateDb(str(tmp_path)), cfg.notify, HOST, clock=FakeClock(), random=lambda: 0.5,
                              start=False)
    try:
        notifier.notify(events)
        for worker in notifier.workers.values():
            worker.step()
    finally:
        notifier.close()


def test_the_owner_route_gets_its_stall_and_another_owners_route_does_not(tmp_path):
    clock = FakeClock()
    with HttpReceiver() as receiver:
        _deliver(_config(receiver.port), tmp_path,
                 [AlertEvent(AlertStatus.FIRING, _stall([ALICE]), started_at=clock.now, ts=clock.now)])
        got = {r.path: r.json() for r in receiver.requests}
    assert sorted(got) == ["/alice", "/ml", "/ops"]  # not /cv: bob's route
    assert "pod ml/train-7f (user alice)" in got["/alice"]["message"]
    assert "pod ml/train-7f（用户 alice）" in got["/ml"]["message"]


def test_owner_routes_get_nothing_that_is_not_about_their_processes(tmp_path):
    clock = FakeClock()
    disk = Finding("fs.usage:/data", Severity.CRITICAL, "/data 97% full", details={"mountpoint": "/data"},
                   labels={"mountpoint": "/data"})
    with HttpReceiver() as receiver:
        _deliver(_config(receiver.port), tmp_path, [
            AlertEvent(AlertStatus.FIRING, disk, started_at=clock.now, ts=clock.now),
            AlertEvent(AlertStatus.FIRING, _stall([BOB], gpu=3), started_at=clock.now, ts=clock.now)])
        got = {r.path: r.json() for r in receiver.requests}
    assert sorted(got) == ["/cv", "/ops"]
    assert got["/ops"]["count"] == 2 and got["/cv"]["count"] == 1
    assert got["/cv"]["key"] == "gpu.stall:3" and "Slurm job 4242 (user bob, account cv)" in got["/cv"]["message"]


def test_a_real_process_is_routed_by_its_own_slurm_environment_and_never_signalled(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "cv"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        clock, gpu = _gpu_holding(child.pid)
        snapshot = Snapshot(ts=clock.now, gpus=(gpu,))
        finding = _stall([], gpu=0)
        (enriched,) = StallDiagnoser(py_spy=False, clock=clock).enrich([finding], snapshot, clock.now)
        owner = enriched.details["owners"][0] if enriched.details["owners"] else {}
        if owner.get("slurm_job") != "4242":
            pytest.skip(f"this test runs inside a container cgroup layout ({owner}): its environment is not read")
        with HttpReceiver() as receiver:
            _deliver(_config(receiver.port), tmp_path,
                     [AlertEvent(AlertStatus.FIRING, enriched, started_at=clock.now, ts=clock.now)])
            paths = sorted(r.path for r in receiver.requests)
        assert paths == ["/cv", "/ops"]
        assert child.poll() is None  # alive and untouched: the only action is a message
    finally:
        child.stdin.close()
        assert child.wait(timeout=10) == 0  # it ended on its own when its input closed, not by a signal


def test_a_cut_environment_routes_to_no_one_it_does_not_name(tmp_path):
    """A pod train-7f-5d9c8 and Slurm job 4242917 whose environment the read limit cuts inside the name:
    the stall reaches neither the route of pod train-7f nor that of job 4242 (someone else's), only what
    is certain: the namespace from the cgroup-confirmed pod, and the default targets."""
    if reason := cgroup_reason(2):
        pytest.skip(reason)
    tree = CgroupTree(cgroup2_root())
    pod_uid = "3c5e9f7a-5b1d-4c2e-9f3a-1b2c3d4e5f60"
    placements = {  # cgroup -> environment
        ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3c5e9f7a_5b1d_4c2e_9f3a_1b2c3d4e5f60"
         f".slice/cri-containerd-{'c0ffee00' * 8}.scope"): cut_inside("POD_NAME", "train-7f-5d9c8", 8,
                                                                       {"POD_UID": pod_uid, "POD_NAMESPACE": "ml"}),
        "user.slice/user-1000.slice/session-3.scope": cut_inside("SLURM_JOB_ID", "4242917", 4,
                                                                 {"SLURM_JOB_ACCOUNT": "cv"}),
    }
    children = []
    try:
        for relpath, env in placements.items():
            children.append(subprocess.Popen(["sleep", "600"], env=env, stdin=subprocess.DEVNULL))
            tree.place(children[-1].pid, relpath)
        clock, gpu = _gpu_holding_all([c.pid for c in children])
        (enriched,) = StallDiagnoser(py_spy=False, clock=clock).enrich(
            [_stall([])], Snapshot(ts=clock.now, gpus=(gpu,)), clock.now)
    finally:
        tree.release()
        for child in children:
            child.kill()
            child.wait(timeout=10)
        tree.close()
    assert [o.get("pod_uid") for o in enriched.details["owners"]] == [pod_uid, None]
    routes = {"ops": [], "ml": ["namespace=ml"], "pod": ["pod=train-7f"], "job": ["slurm_job=4242"],
              "cv": ["slurm_account=cv"]}
    with HttpReceiver() as receiver:
        cfg = config.parse({"gpu": {"act": "notify-owner"}, "notify": {"targets": [
            {"name": name, "url": f"json://127.0.0.1:{receiver.port}/{name}", "owners": owners, "timeout": "2s"}
            for name, owners in routes.items()]}}, "test")
        _deliver(cfg, tmp_path, [AlertEvent(AlertStatus.FIRING, enriched, started_at=clock.now, ts=clock.now)])
        paths = sorted(r.path for r in receiver.requests)
    assert paths == ["/ml", "/ops"]


@pytest.mark.parametrize("gpu,targets,problem", [
    ({"act": "notify-owner"}, [{"name": "ops", "url": "json://127.0.0.1/x"}], 'act = "notify-owner" needs'),
    ({}, [{"name": "alice", "url": "json://127.0.0.1/x", "owners": ["user=alice"]}], "have owners, but [gpu] act"),
    ({"act": "notify-owner"}, [{"name": "a", "url": "json://127.0.0.1/x", "owners": ["uid=1000"]}],
     "owners entry 'uid=1000' must be key=value"),
    ({"act": "notify-owner"}, [{"name": "a", "url": "json://127.0.0.1/x", "owners": ["user"]}],
     "owners entry 'user' must be key=value"),
    ({"act": "kill"}, [], "act"),
])
def test_owner_routes_are_validated(gpu, targets, problem):
    with pytest.raises(config.ConfigError) as caught:
        config.parse({"gpu": gpu, "notify": {"targets": targets}}, "test")
    assert problem in str(caught.value)
