"""deploy/kubernetes/trainguard-daemonset.yaml: valid Kubernetes (kubernetes-validate, strict), and the
choices docs/fleet.md promises: host PID namespace, the NVIDIA runtime without taking a GPU, read-only
host mounts but the state dir, not privileged, the metrics port the embedded config listens on."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest
import yaml
from trainguard import config
from trainguard.config.loader import tomllib

from tests.support.daemon_proc import REPO

MANIFEST = REPO / "deploy" / "kubernetes" / "trainguard-daemonset.yaml"
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")  # the oldest still widely run, and the validator's newest


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def pod_spec() -> dict:
    return documents()["DaemonSet"]["spec"]["template"]["spec"]


def _validator():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.skip("kubernetes-validate not installed (pip package kubernetes-validate)")
    return kubernetes_validate


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_validates_strictly(version):
    kv = _validator()
    for doc in documents().values():
        kv.validate(doc, version, strict=True)


def test_the_validator_rejects_what_the_api_server_would():
    kv = _validator()
    broken = copy.deepcopy(documents()["DaemonSet"])
    broken["spec"]["template"]["spec"]["hostPid"] = True  # misspelt: the API server would drop it silently
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(documents()["DaemonSet"])
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9842"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSIONS[-1])


def test_the_command_line_validator_accepts_the_file():
    if shutil.which("kubernetes-validate") is None:
        pytest.skip("kubernetes-validate not installed (pip package kubernetes-validate)")
    done = subprocess.run(["kubernetes-validate", "--strict", "--quiet", str(MANIFEST)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_host_pid_nvidia_runtime_and_no_gpu_taken():
    spec = pod_spec()
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    resources = container["resources"]
    assert not any("nvidia.com" in k for part in resources.values() for k in part)  # the jobs keep every GPU


def test_not_privileged_and_only_the_state_dir_is_written():
    spec = pod_spec()
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"]["add"]) == {"DAC_READ_SEARCH",
                                                                                        "SYS_PTRACE"}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"proc": "/proc", "host-root": "/", "state": "/var/lib/trainguard"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert [name for name in host_paths if not mounts[name].get("readOnly")] == ["state"]


def test_the_embedded_config_is_valid_and_listens_on_the_declared_port():
    data = tomllib.loads(documents()["ConfigMap"]["data"]["config.toml"])
    cfg = config.parse(data, "configmap")
    (container,) = pod_spec()["containers"]
    port = container["ports"][0]["containerPort"]
    assert cfg.metrics.listen == f"0.0.0.0:{port}"
    assert documents()["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert cfg.general.proc_root == "/host/proc" and cfg.general.host_root == "/host/root"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {cfg.general.proc_root, cfg.general.host_root, cfg.general.state_dir, "/etc/trainguard"} <= mounts


def test_the_metrics_port_takes_its_web_config_from_a_secret():
    """Every pod in the cluster reaches 0.0.0.0:9842: TLS and basic auth come from a Secret, read-only."""
    cfg = config.parse(tomllib.loads(documents()["ConfigMap"]["data"]["config.toml"]), "configmap")
    spec = pod_spec()
    (container,) = spec["containers"]
    web = {m["name"]: m for m in container["volumeMounts"]}["web"]
    assert web["readOnly"] and cfg.metrics.web_config == f"{web['mountPath']}/web.yml"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "web"]
    assert volume["secret"]["secretName"] == "trainguard-web" and not volume["secret"].get("optional")
    assert documents()["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
