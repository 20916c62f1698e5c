"""The mirror on a share that hangs (the real SlowFs FUSE mount): `trainguard mirror --once` ends in seconds and
names the dest, an interrupted command leaves no copier behind, a metadata operation that hangs trips the short
meta_timeout, and a copier the kernel keeps is reported and never joined by a second one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from trainguard import config as configmod
from trainguard.actions.mirror.record import copier_rows
from trainguard.actions.mirror.runner import COPIER
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.service.daemon import Daemon
from trainguard.sources.procs import read_threads
from trainguard.store.state import read_only

from tests.support.cli import cli_env, trainguard
from tests.support.clock import FakeClock
from tests.support.fake_daemon import Recorder
from tests.test_mirror import runner_for, write

HUNG_BOUND = 15.0  # what a user waits at most for `mirror --once` on a hung share, start-up included
PROBE_TIMEOUT = configmod.Config().filesystems.probe_timeout


def copiers(pid: int | None = None, *, besides: tuple[int, ...] = (), zombies: bool = True) -> list[int]:
    """PIDs of the copier processes among pid's children (this process by default). A killed copier whose copy
    thread sits in the kernel shows as a zombie with no command line: any child but `besides` counts then
    (zombies=False: never; the share's probe child, gone but not yet reaped, is one too)."""
    out = []
    for child in psutil.Process(pid or os.getpid()).children():
        try:
            if COPIER in child.cmdline():
                out.append(child.pid)
        except psutil.ZombieProcess:
            if zombies and child.pid not in besides:
                out.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def config_file(tmp_path: Path, share: Path, **mirror: str) -> Path:
    extra = "".join(f'{k} = "{v}"\n' for k, v in mirror.items())
    path = tmp_path / "c.toml"
    path.write_text(f'[general]\nstate_dir = "{tmp_path / "state"}"\n[gpu]\nenabled = false\n'
                    f'[[mirror]]\nname = "runs"\nsource = "{tmp_path / "src"}"\ndest = "{share}"\n{extra}')
    return path


def recorded_copiers(tmp_path: Path) -> dict:
    conn = read_only(str(tmp_path / "state"))
    try:
        return copier_rows(conn)
    finally:
        conn.close()


def gone(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs", "source": "autodl-fs"}], indirect=True)
def test_mirror_once_on_a_hung_dest_exits_nonzero_in_seconds_naming_dest_and_mount(tmp_path, slowfs):
    write(tmp_path / "src" / "run1" / "events.out.tfevents.1", b"\x00" * 4096)
    share = Path(slowfs.mountpoint) / "runs"
    config = config_file(tmp_path, share)
    slowfs.block("all")  # statfs, mkdir, everything: the share does not answer at all
    try:
        started = time.monotonic()
        done = trainguard("-c", str(config), "mirror", "--once", timeout=60)
        took = time.monotonic() - started
        assert done.returncode == 1, done.stderr
        assert took < HUNG_BOUND, f"mirror --once took {took:.1f}s on a hung share"
        [line] = [x for x in done.stderr.splitlines() if x.startswith("runs:")]
        assert f"not on {share}:" in line and f"{slowfs.mountpoint} (fuse.autodlfs) does not answer statfs" in line
        assert slowfs.stats()["calls"].get("mkdir", 0) == 0, "no copier was started on the hung share"
        assert recorded_copiers(tmp_path) == {}
        # (>= 1: any other statfs of this mount, a `df` or another daemon on this machine, waits as well)
        assert slowfs.stats()["waiting"].get("statfs", 0) >= 1, "the probe child waits in the kernel"

        started = time.monotonic()
        again = trainguard("-c", str(config), "mirror", "--once", timeout=60)
        again_took = time.monotonic() - started
        assert again.returncode == 1
        [line] = [x for x in again.stderr.splitlines() if x.startswith("runs:")]
        assert f"{slowfs.mountpoint} (fuse.autodlfs) does not answer statfs" in line and "earlier probe" in line
        # A new probe would have been waited for probe_timeout (5s): run again, it starts none to get stuck.
        assert again_took < PROBE_TIMEOUT, f"{again_took:.1f}s"
    finally:
        slowfs.reset()
    assert trainguard("-c", str(config), "mirror", "--once").returncode == 0, "the share answers again: copied"
    print(f"mirror --once on a hung dest: {took:.2f}s, run again while it hangs: {again_took:.2f}s "
          f"(bound {HUNG_BOUND:.0f}s)")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_sigterm_to_mirror_once_kills_and_reaps_its_copier(tmp_path, slowfs, signum):
    write(tmp_path / "src" / "ckpt.pt", os.urandom(16 * 2**20))
    share = Path(slowfs.mountpoint) / "runs"
    slowfs.delay("write", 0.05)  # a slow share that still answers: the copy takes about 6 s
    cli = subprocess.Popen([sys.executable, "-m", "trainguard", "-c", str(config_file(tmp_path, share)), "mirror",
                            "--once"], env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # a bound on waiting for the event, not a timing claim
        while not (found := copiers(cli.pid, zombies=False)) and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.02)
        assert cli.poll() is None, cli.communicate()
        [copier] = found
        while not slowfs.stats()["calls"].get("write") and time.monotonic() < deadline:
            time.sleep(0.02)  # the copy is under way on the share
        cli.send_signal(signum)  # SIGINT: Ctrl-C, which the copier (in its own session) does not get
        _, err = cli.communicate(timeout=15)
        assert cli.returncode == 128 + signum, err
        assert f"mirror stopped by {signum.name}" in err and "stopped before the copy finished" in err
        assert not psutil.pid_exists(copier), "the copier was killed and reaped, not left behind"
        assert recorded_copiers(tmp_path) == {}
        assert not (share / "ckpt.pt").exists(), "no torn copy under the final name"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        slowfs.reset()


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_a_copier_stuck_in_the_kernel_is_named_and_no_second_one_starts(tmp_path, slowfs):
    write(tmp_path / "src" / "ckpt.pt", os.urandom(2**20))
    share = Path(slowfs.mountpoint) / "runs"
    config = config_file(tmp_path, share)
    slowfs.block("write")  # statfs answers, the data never arrives: the probe cannot tell, the copier sits in write
    cli = subprocess.Popen([sys.executable, "-m", "trainguard", "-c", str(config), "mirror", "--once"],
                           env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    stuck = None
    try:
        slowfs.wait_blocked("write", timeout=20)
        [stuck] = copiers(cli.pid)
        stuck = psutil.Process(stuck)
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=15)
        assert cli.returncode == 128 + signal.SIGTERM, err
        assert f"its copier (pid {stuck.pid}) stays stuck in the kernel in write" in err
        states = {t.state for t in read_threads("/proc", stuck.pid)}
        assert "D" in states, f"a copy thread waits in the FUSE request the server holds: {states}"
        [row] = recorded_copiers(tmp_path).values()
        assert (row.pid, row.op) == (stuck.pid, "write") and row.stuck_since is not None

        again = trainguard("-c", str(config), "mirror", "--once", timeout=30)
        assert again.returncode == 1
        assert f"its copier (pid {stuck.pid}) is stuck in the kernel in write" in again.stderr
        assert slowfs.stats()["waiting"].get("write") == 1, "no second copier joined the stuck one"
        status = trainguard("-c", str(config), "status", "--json", timeout=30)
        [doc] = json.loads(status.stdout)["mirrors"]
        assert doc["stuck_copier"]["pid"] == stuck.pid and doc["stuck_copier"]["op"] == "write"
    finally:
        slowfs.reset()
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert stuck is not None and gone(stuck.pid, 10), "the share answered: the killed copier ends"
    assert trainguard("-c", str(config), "mirror", "--once").returncode == 0
    assert (share / "ckpt.pt").read_bytes() == (tmp_path / "src" / "ckpt.pt").read_bytes()
    assert recorded_copiers(tmp_path) == {}


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_a_hung_rename_trips_meta_timeout_not_file_timeout(tmp_path, slowfs):
    src, share = tmp_path / "src", Path(slowfs.mountpoint)
    write(src / "run/ckpt.pt", os.urandom(2**20))
    clock = FakeClock()
    runner = runner_for(tmp_path, src, share, clock, meta_timeout="10s", file_timeout="5m")
    runner.poll = 0.05
    slowfs.block("rename")
    result = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    try:
        slowfs.wait_blocked("rename", timeout=10)
        deadline = time.monotonic() + 10
        while runner.activity[0] != "rename" and time.monotonic() < deadline:
            time.sleep(0.01)  # the report line is on its way
        clock.advance(11)  # past meta_timeout, far from file_timeout
        t.join(10)
        assert not t.is_alive(), "the hung rename was given up after meta_timeout"
        state = result[0]
        assert state.reason_kind == "unresponsive" and "rename" in state.reason
        assert "no progress for 10s" in state.reason and "5m" not in state.reason
        [copier] = copiers(besides=(slowfs.pid,))
        assert (state.stuck_pid, state.stuck_op) == (copier, "rename"), "the copier the kernel keeps is named"
        assert state.stuck_path == str(share / "run/ckpt.pt")
        again = runner.run()  # the share still hangs: no second copier
        assert copiers(besides=(slowfs.pid,)) == [copier] and "is stuck in the kernel in rename" in again.reason
    finally:
        slowfs.reset()
    state = runner.run()
    assert (state.pending_files, state.reason, state.stuck_pid) == (0, "", None)
    assert (share / "run/ckpt.pt").read_bytes() == (src / "run/ckpt.pt").read_bytes()


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs"}], indirect=True)
def test_a_write_that_waits_longer_than_meta_timeout_is_still_waited_for(tmp_path, slowfs):
    src, share = tmp_path / "src", Path(slowfs.mountpoint)
    write(src / "ckpt.pt", os.urandom(2**20))
    clock = FakeClock()
    runner = runner_for(tmp_path, src, share, clock, meta_timeout="10s", file_timeout="60s")
    runner.poll = 0.05
    slowfs.block("write")
    result = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    try:
        slowfs.wait_blocked("write", timeout=10)
        deadline = time.monotonic() + 10
        while runner.activity[0] != "write" and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.advance(30)  # past meta_timeout: a data write is not judged by it
        t.join(1.0)  # twenty supervisor polls
        assert t.is_alive(), "a slow write is not killed after meta_timeout"
        clock.advance(31)
        t.join(10)
        assert not t.is_alive()
        assert "write" in result[0].reason and "no progress for 1m" in result[0].reason
    finally:
        slowfs.reset()
        t.join(10)


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs", "source": "autodl-fs"}], indirect=True)
def test_the_daemon_never_has_two_copiers_for_a_mirror_while_the_share_hangs(tmp_path, slowfs):
    """Writes hang but statfs answers (the mount probe cannot tell): every round would start a copier, and each
    would join the last one in the kernel. Rounds, and a reload that builds new mirror threads, start none."""
    events_file = tmp_path / "src" / "run1" / "events.out.tfevents.1.host"
    write(events_file, b"\x00" * 50_000)
    share = Path(slowfs.mountpoint) / "runs"
    config = config_file(tmp_path, share, every="10s", meta_timeout="5s", file_timeout="8s", lag_warning="30s")
    config.write_text(config.read_text().replace("[gpu]", '[metrics]\nlisten = ""\n[alerts]\nkeep_firing_for = "0s"\n'
                                                          '[notify]\nlanguage = "zh"\n[gpu]'))
    slowfs.block("write")
    clock = FakeClock(wall=time.time(), mono=1000.0)
    notes = Recorder()
    daemon = Daemon(configmod.load(str(config)), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[notes])
    try:
        slowfs.wait_blocked("write", timeout=20)
        deadline = time.monotonic() + 10
        while daemon.mirror.activity("runs")[0] != "write" and time.monotonic() < deadline:
            time.sleep(0.01)  # its last report line is on its way: the no-progress clock starts there
        [first] = copiers(besides=(slowfs.pid,))
        clock.advance(9)  # past file_timeout: the copier is killed; the kernel keeps it
        assert daemon.mirror.wait_rounds("runs", 1, timeout=15)
        for rounds in range(2, 5):
            clock.advance(10)  # the next round is due, and finds the copier still there
            assert daemon.mirror.wait_rounds("runs", rounds, timeout=15)
            assert copiers(besides=(slowfs.pid,)) == [first], "one copier per mirror, however many rounds"
        [state] = daemon.mirror.states()
        assert state.stuck_pid == first and state.stuck_op == "write" and f"pid {first}" in state.reason
        assert slowfs.stats()["waiting"]["write"] == 1

        assert daemon.reload()  # new mirror threads, new runners: the recorded copier still counts
        clock.advance(10)
        assert daemon.mirror.wait_rounds("runs", 1, timeout=15)
        assert copiers(besides=(slowfs.pid,)) == [first] and slowfs.stats()["waiting"]["write"] == 1
        assert "is stuck in the kernel in write" in daemon.mirror.states()[0].reason

        clock.advance(30)
        daemon.cycle()
        [fired] = [e for e in notes.events if e.finding.key == "mirror.lag:runs"]
        why = texts_for(fired.finding, tr("zh")).why
        assert f"复制进程（PID {first}）卡在内核里的 write" in why
    finally:
        slowfs.reset()
    assert gone(first, 10) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    clock.advance(10)
    assert daemon.mirror.wait_rounds("runs", 2, timeout=15)
    try:
        assert (share / "run1" / events_file.name).read_bytes() == events_file.read_bytes()
        assert daemon.mirror.states()[0].stuck_pid is None
    finally:
        daemon.stop_event.set()
        daemon.close()
