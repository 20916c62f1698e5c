"""Scenario D, the seed's own setting end to end: a rented GPU container's day on which the share hangs.

One ``unshare --pid --mount --fork --mount-proc`` namespace is the container. Its local
data disk is a small loop-mounted ext4, its shared store a FUSE mount
(``fuse.autodl-fs``) that answers every write ``WRITE_LATENCY_S`` late. trainguard
runs inside, started as docs/container.md says (``nohup trainguard run --state-dir
... --log-file ... &``), with a ``[[mirror]]`` from the local disk to the share, a
``checkpoints`` policy with ``only_if_mirrored`` and zh alerts to a JSON webhook on
loopback. A real tiny Lightning run (``torch_trainer.py``) writes TensorBoard event
files and checkpoints to the local disk while the share hangs twice for ``HANG_S``.

Before that, the same run is timed writing straight to the share and to the local disk
(mirrored): the seed's speed claim, measured. ``run_share_day`` returns everything;
``test_scenario_d.py`` asserts on it and ``bench/report`` prints it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.scenarios import webhook
from tests.scenarios.harness import HERE, Child, Processes, pending_messages, recorded_points, wait_until
from tests.scenarios.runs import sha256_of
from tests.scenarios.workload import webhook_config
from tests.support import NOT_INSTALLED
from tests.support.container import container_reason
from tests.support.http_receiver import HttpReceiver
from tests.support.mounts import root_reason
from tests.support.slowfs import SlowFs, fuse_available

TORCH_TRAINER = HERE / "torch_trainer.py"
SHARE_NAME = "autodl-fs"
# A network file store's round trip for one write request (up to 128 KiB through FUSE): a few ms.
WRITE_LATENCY_S = 0.005
SHARE_CACHE_S = 1.0  # names and attributes cached like libfuse's default (1 s); statfs and writes always go out
LOCAL_DISK_BYTES = 64 * 2**20  # about 53 MiB usable: less than the checkpoints the day saves
HANG_S = 60.0
INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0
KEEP_FIRING_S = 2.0
LAG_WARNING_S = 10.0
CKPT_SECONDS = 4.0  # a checkpoint (~1 MiB: weights and Adam state) every 4 s of training
SPEED_STEPS = 1000
WARMUP_STEPS = 20
RECOVER_TIMEOUT_S = 60.0  # after a hang: both alerts resolved, the mirror caught up
CLEANUP_WAIT_S = 90.0  # between the hangs: a cleanup that deletes (the policy runs every 60 s)
TAIL_STEPS = 300  # the main run ends this many steps after the share recovered from the second hang
_FREED = re.compile(r"cleanup checkpoints \((?:schedule|watermark)\) freed .* \(([1-9]\d*) files\)")

# The namespace's PID 1: reaps whatever is reparented to it (the nohup'd daemon), like an init.
_REAPER = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


def day_missing() -> str | None:
    """What this machine lacks for the scenario, named; None when it can run."""
    for module, package in (("torch", "torch (a CPU build will do)"), ("lightning", "lightning"),
                            ("tensorboard", "tensorboard (Lightning's TensorBoardLogger writes with it)")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} {NOT_INSTALLED}"
    return root_reason(need_loop=True) or fuse_available() or container_reason()


class Container:
    """A PID + mount namespace with its own /proc; processes join it with nsenter, like ``docker exec``.

    ``--kill-child``: when the unshare process ends (the harness stops it by PID), the
    namespace's init is SIGKILLed and with it every process inside.
    """

    def __init__(self, procs: Processes, name: str = "container") -> None:
        self.procs = procs
        self.init = self._child(name, ["unshare", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc",
                                       sys.executable, "-c", _REAPER], procs.env())
        self.init_pid = wait_until(self._find_init, 10, "the container's init", abort=self.init.died)

    def _find_init(self) -> int | None:
        try:
            children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def _child(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        child = Child(name, argv, self.procs.workdir / f"{name}.log", env)
        self.procs.children.append(child)
        return child

    def exec(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Start argv inside the container; its output goes to ``<workdir>/<name>.log``."""
        return self._child(name, ["nsenter", "--target", str(self.init_pid), "--pid", "--mount", "--", *argv],
                           env if env is not None else self.procs.env())


def day_config(local: Path, share: Path, webhook_url: str) -> str:
    """trainguard's config inside the container: watch both disks, mirror runs/ to the share,
    delete local checkpoints only once the share holds them, alerts in Chinese."""
    notify = webhook_config(webhook_url).replace("[notify]\n", '[notify]\nlanguage = "zh"\n', 1)
    return f"""
[general]
interval = "{INTERVAL_S:g}s"

[filesystems]
paths = ["{local}", "{share}"]
exclude = ["*"]            # only the container's two disks: other mounts on a CI host are not this test's business
probe_timeout = "{PROBE_TIMEOUT_S:g}s"

[forecast]
enabled = false            # the run fills and cleanup empties the small disk in seconds: not what this day is about

[alerts]
keep_firing_for = "{KEEP_FIRING_S:g}s"

[metrics]
listen = ""

[[mirror]]
name = "runs"
source = "{local}/runs"
dest = "{share}/runs"
every = "1s"
lag_warning = "{LAG_WARNING_S:g}s"
file_timeout = "5s"

[[cleanup]]
name = "checkpoints"
type = "checkpoints"
roots = ["{local}/runs"]
patterns = ["*.ckpt"]
keep_last = 3
grace = "1s"
schedule = "60s"
watermark = true
high = "50%"
low = "30%"
only_if_mirrored = "runs"
""" + notify


@dataclass
class Trained:
    """One trainer run: its exit status, its measured rate and the checkpoints it saved."""

    root: Path
    status: int
    steps: int
    steps_per_s: float | None
    saved: list[dict]
    output: str


@dataclass
class Hang:
    hung_at: float  # monotonic
    recovered_at: float
    steps_before: int
    steps_after: int
    trainer_running_after: bool


@dataclass
class ShareDayRun:
    local: Path
    share: Path
    direct: Trained | None = None  # the speed run writing straight to the share
    mirrored: Trained | None = None  # the same run on local disk, mirrored
    main: Trained | None = None
    hangs: list[Hang] = field(default_factory=list)
    alerts: list[webhook.ReceivedAlert] = field(default_factory=list)
    usage: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, used/(used+avail)) of the local disk
    left_local: set[str] = field(default_factory=set)  # the files under the local runs/ at the end
    status_output: str = ""  # `trainguard status` right after the start
    daemon_log: str = ""
    daemon_stopped: bool = False
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def saved(self) -> list[dict]:
        """Every checkpoint the runs on local disk saved (the mirrored speed run and the day)."""
        return [s for t in (self.mirrored, self.main) if t is not None for s in t.saved]

    @property
    def kept_local(self) -> list[dict]:
        """The saved checkpoints still on local disk at the end (cleanup deleted the others)."""
        return [s for s in self.saved if s["path"] in self.left_local]

    @property
    def speedup(self) -> float | None:
        if self.direct is None or self.mirrored is None or not self.direct.steps_per_s or not self.mirrored.steps_per_s:
            return None
        return self.mirrored.steps_per_s / self.direct.steps_per_s


class DiskSampler:
    """statvfs of the local disk every 0.2 s on a thread: the disk must never be seen full."""

    def __init__(self, path: Path) -> None:
        self.path, self.samples = path, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disk-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            st = os.statvfs(self.path)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            self.samples.append((time.monotonic(), used / (used + st.f_bavail * st.f_frsize)))

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def train(box: Container, workdir: Path, name: str, root: Path, steps: int, state_dir: Path) -> tuple[Child, Path]:
    """Start the Lightning run inside the container; the guard reports to the daemon's state dir."""
    status = workdir / f"{name}-status.json"
    env = box.procs.env({"TRAINGUARD_STATE_DIR": str(state_dir)})
    child = box.exec(name, [sys.executable, str(TORCH_TRAINER), "--root", str(root), "--steps", str(steps),
                            "--status", str(status), "--manifest", str(workdir / f"{name}-manifest.jsonl"),
                            "--last-step-file", str(workdir / f"{name}-last-step"),
                            "--ckpt-seconds", f"{CKPT_SECONDS:g}", "--warmup", str(WARMUP_STEPS)], env)
    return child, status


def finish(child: Child, status: Path, workdir: Path, name: str, root: Path, timeout: float) -> Trained:
    code = child.wait(timeout)
    progress = _read_json(status)
    return Trained(root, code, progress.get("step", 0), progress.get("steps_per_s"),
                   _read_lines(workdir / f"{name}-manifest.jsonl"), child.output())


def progress_of(status: Path) -> int:
    return _read_json(status).get("step", 0)


def start_daemon(box: Container, config: Path, state_dir: Path, share: Path) -> str:
    """``nohup trainguard run ... &`` inside the container, as docs/container.md says; then ``trainguard status``."""
    tg = f"{shlex.quote(sys.executable)} -m trainguard --config {shlex.quote(str(config))} " \
         f"--state-dir {shlex.quote(str(state_dir))}"
    log = shlex.quote(str(state_dir / "trainguard.log"))
    starter = box.exec("start-trainguard", ["sh", "-c", f"mkdir -p {shlex.quote(str(state_dir))} && "
                                            f"nohup {tg} run --log-file {log} >/dev/null 2>&1 &"])
    assert starter.wait(20) == 0, starter.output()
    wait_until(lambda: len(recorded_points(state_dir, f"fs.avail_bytes:{share}")) >= 2, 60,
               "trainguard watching the share")
    status = box.exec("trainguard-status", ["sh", "-c", f"{tg} status"])
    status.wait(60)
    return status.output()


def stop_daemon(box: Container, state_dir: Path) -> bool:
    """``kill "$(cat .../trainguard.pid)"`` inside the container; True once the daemon has exited."""
    pid_file = shlex.quote(str(state_dir / "trainguard.pid"))
    stopper = box.exec("stop-trainguard", ["sh", "-c", f'pid=$(cat {pid_file}) && kill "$pid" && '
                                           'while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done'])
    try:
        return stopper.wait(30) == 0
    except TimeoutError:
        return False


def not_on_share(local_runs: Path, share_runs: Path) -> list[str]:
    """Files under the local runs/ whose copy on the share is missing or has other bytes.

    A copy the mirror is renaming over right now can vanish between the check and the read: the
    share's name cache still holds the replaced file, as NFS's does (ESTALE there). That copy is
    not there yet, and the caller asks again."""
    out = []
    for path in sorted(p for p in local_runs.rglob("*") if p.is_file()):
        copy = share_runs / path.relative_to(local_runs)
        try:
            same = copy.is_file() and sha256_of(copy) == sha256_of(path)
        except FileNotFoundError:
            same = False
        if not same:
            out.append(str(path.relative_to(local_runs)))
    return out


def resolved(receiver: HttpReceiver, kind: str) -> int:
    return len(webhook.find(webhook.received(receiver), kind, "resolved"))


def cleanups_that_deleted(daemon_log: Path) -> int:
    """How many cleanup runs have deleted checkpoints so far, from the daemon's log file."""
    try:
        return len(_FREED.findall(daemon_log.read_text(errors="replace")))
    except OSError:
        return 0


def hang_share(share: SlowFs, status: Path, trainer: Child, receiver: HttpReceiver) -> Hang:
    """Hang every operation on the share for HANG_S, then let it answer again and wait until it has
    recovered: both alerts resolved (the lag's needs the mirror caught up)."""
    before_resolved = {kind: resolved(receiver, kind) for kind in ("fs.unresponsive", "mirror.lag")}
    steps_before = progress_of(status)
    share.block("all")
    hung_at = time.monotonic()
    while time.monotonic() < hung_at + HANG_S:  # the hang's length is the scenario's, not a guess
        time.sleep(0.5)
    steps_after, running = progress_of(status), trainer.running()
    share.unblock("all")  # the write latency stays
    recovered_at = time.monotonic()
    try:
        wait_until(lambda: all(resolved(receiver, k) > n for k, n in before_resolved.items()), RECOVER_TIMEOUT_S,
                   "the share's alerts resolving")
    except TimeoutError:
        pass  # recorded by their absence in the alerts
    return Hang(hung_at, recovered_at, steps_before, steps_after, running)


def speed_runs(box: Container, workdir: Path, run: ShareDayRun, state_dir: Path) -> None:
    """The seed's speed claim: the same run on local disk (mirrored by the daemon) and straight on the share."""
    for name, root in (("speed-local", run.local / "runs" / "speed"), ("speed-share", run.share / "direct")):
        child, status = train(box, workdir, name, root, SPEED_STEPS, state_dir)
        trained = finish(child, status, workdir, name, root, timeout=600)
        if name == "speed-local":
            run.mirrored = trained
        else:
            run.direct = trained


def the_day(box: Container, workdir: Path, run: ShareDayRun, share: SlowFs, receiver: HttpReceiver,
            state_dir: Path) -> None:
    """Train on local disk through two hangs of the share. Between them the share works until a cleanup
    has deleted mirrored checkpoints again (in the field hangs are hours apart); after the second the
    run ends TAIL_STEPS later."""
    child, status = train(box, workdir, "main", run.local / "runs" / "exp1", 10**9, state_dir)
    wait_until(lambda: progress_of(status) >= 2 * WARMUP_STEPS, 120, "the main run training", abort=child.died)
    log = state_dir / "trainguard.log"
    run.hangs.append(hang_share(share, status, child, receiver))
    deleted = cleanups_that_deleted(log)
    try:
        wait_until(lambda: cleanups_that_deleted(log) > deleted, CLEANUP_WAIT_S, "a cleanup after the hang")
    except TimeoutError:
        pass  # the disk shows it
    run.hangs.append(hang_share(share, status, child, receiver))
    (workdir / "main-last-step").write_text(str(progress_of(status) + TAIL_STEPS))
    run.main = finish(child, status, workdir, "main", run.local / "runs" / "exp1", timeout=300)


def run_share_day(workdir: Path, local: Path, share: SlowFs, receiver: HttpReceiver) -> ShareDayRun:
    run = ShareDayRun(local, share.mountpoint)
    state_dir, config = local / "trainguard", workdir / "trainguard.toml"
    config.write_text(day_config(local, share.mountpoint, receiver.url))
    local_runs, share_runs = local / "runs", share.mountpoint / "runs"
    local_runs.mkdir()
    share.delay("write", WRITE_LATENCY_S)
    run.started_at = time.monotonic()
    with Processes(workdir / "procs") as procs, DiskSampler(local) as disk:
        box = Container(procs)
        run.status_output = start_daemon(box, config, state_dir, share.mountpoint)
        speed_runs(box, workdir, run, state_dir)
        the_day(box, workdir, run, share, receiver, state_dir)
        try:
            wait_until(lambda: not not_on_share(local_runs, share_runs), 120, "the share holding every file")
            wait_until(lambda: pending_messages(state_dir) == 0, 30, "an empty outbox")
        except TimeoutError:
            pass  # the test names what is missing
        run.daemon_stopped = stop_daemon(box, state_dir)
    run.ended_at = time.monotonic()
    run.left_local = {str(p) for p in local_runs.rglob("*") if p.is_file()}
    run.usage = disk.samples
    run.alerts = webhook.received(receiver)
    log = state_dir / "trainguard.log"
    run.daemon_log = log.read_text(errors="replace") if log.exists() else ""
    return run
