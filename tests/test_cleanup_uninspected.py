"""Cleanup without root: processes of other users whose open files cannot be read are said in the
report and the dry run, and the due files they could have open are kept ("unverifiable-open").

The real case: a process of uid 65534 holds a file open, and `trainguard cleanup` runs as uid
65533, for which that process's /proc/PID/fd is unreadable. In a PID namespace of their own
(unshare), those two are the only processes, so the permission rule itself is what decides."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.daemon_proc import REPO
from tests.support.mounts import root_reason
from tests.test_cleanup_inuse import attached
from trainguard.actions.cleanup.safety.uninspected import HoldBack, Uninspected, read_uninspected

RUNNER, HOLDER = 65533, 65534  # the cleanup's user, the other user (nobody)
OLD = time.time() - 30 * 86400
# name -> (owner uid, group gid, mode, kept): what uid 65534 could open is kept.
FILES = {
    "own-private.bin": (RUNNER, RUNNER, 0o600, False),
    "own-world-readable.bin": (RUNNER, RUNNER, 0o644, True),
    "holders-own.bin": (HOLDER, HOLDER, 0o600, True),
    "holders-group.bin": (RUNNER, HOLDER, 0o640, True),
    "root-group.bin": (RUNNER, 0, 0o640, False),
    "held-open.bin": (HOLDER, HOLDER, 0o600, True),  # the one the holder really has open
}


def _st(mode: int, uid: int = 1000, gid: int = 1000) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


def test_hold_back_follows_the_permissions_of_the_uninspected_processes():
    nobody = HoldBack([Uninspected(7, frozenset({HOLDER}), frozenset({HOLDER, 100}), False)])
    reg, dirs, link = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK
    assert nobody(_st(reg | 0o600, uid=HOLDER))  # its own file
    assert nobody(_st(reg | 0o604))  # readable by others
    assert nobody(_st(reg | 0o620, gid=100))  # writable by one of its groups
    assert not nobody(_st(reg | 0o640, gid=5))  # a group it is not in, nothing for others
    assert not nobody(_st(reg | 0o601))  # execute alone opens nothing
    assert nobody(_st(dirs | 0o701))  # a directory it can enter: the files inside may be open
    assert not nobody(_st(dirs | 0o700))
    assert not nobody(_st(link | 0o777))  # a symlink is never open
    root = HoldBack([Uninspected(1, frozenset({0}), frozenset({0}), True)])  # bypasses permissions
    assert root(_st(reg | 0o600)) and root(_st(dirs | 0o700))


def test_kernel_threads_hold_no_files_and_are_not_counted():
    kthreads = [p for p in os.listdir("/proc") if p.isdigit() and _is_kthread(p)]
    if not kthreads:
        pytest.skip("no kernel thread visible in this PID namespace")
    assert read_uninspected("/proc", kthreads[0]) is None
    me = read_uninspected("/proc", str(os.getpid()))
    assert me is not None and os.geteuid() in me.uids and os.getegid() in me.gids


def _is_kthread(pid: str) -> bool:
    try:
        return not Path(f"/proc/{pid}/cmdline").read_bytes() and int(
            Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[6]) & 0x00200000 != 0
    except OSError:
        return False


def _reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: the test runs processes as two other users"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                          timeout=30)
    if done.returncode != 0:
        return f"cannot make a PID namespace here: {done.stderr.decode(errors='replace').strip()}"
    return None


@pytest.fixture
def tree():
    """A tree that uid 65533 may clean, in a directory both test users can reach."""
    base = Path(tempfile.mkdtemp(prefix="tg-uninspected-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = base / "old"
    root.mkdir()
    os.chown(root, RUNNER, RUNNER)
    for name, (uid, gid, mode, _kept) in FILES.items():
        path = root / name
        path.write_bytes(b"x" * 4096)
        os.chown(path, uid, gid)
        os.chmod(path, mode)
        os.utime(path, (OLD, OLD))
    state = base / "state"
    state.mkdir()
    os.chown(state, RUNNER, RUNNER)
    (base / "config.toml").write_text(
        f'[[cleanup]]\nname = "old"\ntype = "age"\nroots = ["{root}"]\nolder_than = "7d"\n'
        'age_by = ["mtime"]\ngrace = "0s"\nmax_delete = false\nremove_empty_dirs = false\n')
    yield base
    shutil.rmtree(base, ignore_errors=True)


# Runs in a mount namespace of its own (and, with a holder, as PID 1 of a PID namespace of its own).
# First makes the interpreter reachable for the test users (it may live under a 0700 /root: a
# tmpfs over /root there, with the real /root/.pyenv bound back in); then starts the holder (uid
# 65534, one file open) and waits until it holds it; then becomes uid 65533 and runs the cleanup
# itself, so that no process of root is left in a PID namespace of its own.
LAUNCHER = r"""
import os, signal, subprocess, sys
base, held, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if sys.prefix.startswith("/root/"):
    keep = os.path.join(base, "pyenv")
    os.makedirs(keep, exist_ok=True)
    top = "/root/" + sys.prefix.split("/")[2]
    for cmd in (["mount", "--bind", top, keep], ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/root"],
                ["mkdir", top], ["mount", "--bind", keep, top]):
        subprocess.run(cmd, check=True)
if held != "-":
    r, w = os.pipe()
    if os.fork() == 0:
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        fd = os.open(held, os.O_RDONLY)
        os.write(w, b"1")
        signal.pause()  # holds the file until the namespace ends (reading r here could eat the "1")
        os._exit(0)
    os.read(r, 1)
os.setgroups([]); os.setgid(65533); os.setuid(65533)
os.execv(sys.executable, [sys.executable, "-m", "trainguard", *argv])
"""


def _cleanup_as_runner(base: Path, *extra: str, namespace: bool = True,
                       holder: bool = True) -> subprocess.CompletedProcess:
    """`trainguard cleanup` as uid 65533 on base's config; in a PID namespace, beside the holder (unless
    holder=False: then it is the namespace's only process)."""
    argv = ["cleanup", "--config", str(base / "config.toml"), "--state-dir", str(base / "state"), *extra]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO / "daemon"), "PYTHONDONTWRITEBYTECODE": "1"}
    pid_ns = ["--pid", "--fork", "--mount-proc"] if namespace else []
    held = str(base / "old" / "held-open.bin") if namespace and holder else "-"
    cmd = ["unshare", "--mount", *pid_ns, sys.executable, "-c", LAUNCHER, str(base), held, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(params=["alone", "beside-a-hidden-loop-image"])
def elsewhere(request):
    """Nothing, or a loop image attached in a 0700 directory of its own under /tmp (the tree's filesystem):
    the run cannot look into it, yet it is not under the tree's root, so it holds nothing there."""
    if request.param == "alone":
        yield
        return
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    secret = Path(tempfile.mkdtemp(prefix="tg-other-image-", dir="/tmp"))  # 0700, root's
    image = secret / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(1 << 20)
    try:
        with attached(image):
            yield
    finally:
        shutil.rmtree(secret, ignore_errors=True)


def test_a_run_that_cannot_inspect_another_users_process_keeps_what_it_could_have_open(tree, elsewhere):
    why = _reason()
    if why:
        pytest.skip(why)
    kept = sorted(n for n, (*_x, keep) in FILES.items() if keep)
    dry = _cleanup_as_runner(tree, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "1 process of other users could not be inspected (run as root to check their open files)" in dry.stdout
    assert f"skipped {len(kept)} unverifiable-open" in dry.stdout, dry.stdout
    assert f"({len(FILES) - len(kept)} files)" in dry.stdout, dry.stdout
    assert sorted(os.listdir(tree / "old")) == sorted(FILES)  # a dry run touches nothing

    real = _cleanup_as_runner(tree)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "1 process of other users could not be inspected" in real.stdout
    assert f"skipped {len(kept)} unverifiable-open" in real.stdout, real.stdout
    assert sorted(os.listdir(tree / "old")) == kept


def test_a_root_process_that_cannot_be_inspected_could_have_any_file_open(tree):
    """Outside a namespace of its own, the run as uid 65533 meets root's processes (this test's
    among them): they may open any file, so nothing due is deleted, and the run says why."""
    why = _reason()
    if why:
        pytest.skip(why)
    done = _cleanup_as_runner(tree, namespace=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "processes of other users could not be inspected (run as root" in done.stdout, done.stdout
    assert f"skipped {len(FILES)} unverifiable-open" in done.stdout, done.stdout
    assert sorted(os.listdir(tree / "old")) == sorted(FILES)


def test_the_report_and_its_message_say_what_was_kept_and_why():
    from trainguard.actions.cleanup.record.report import CleanupReport, RootReport, findings_for, summary_lines
    from trainguard.i18n import tr
    from trainguard.notify.texts import texts_for

    report = CleanupReport("old", "age", "schedule", False, 0.0, 1.0, (RootReport("/data/old", "/data", 2, 8192),),
                           2, 8192, skipped={"unverifiable-open": 4}, uninspected=3)
    assert "3 processes of other users could not be inspected" in "\n".join(summary_lines(report))
    found = {f.kind: f for f in findings_for(report)}
    assert found["cleanup.unverified"].details["unverifiable"] == 4
    for lang, words in (("en", "3 processes of other users could not be inspected"), ("zh", "3 个其他用户的进程")):
        for kind in ("cleanup.report", "cleanup.unverified"):
            texts = texts_for(found[kind], tr(lang))
            assert not texts.fallback and words in texts.what, (lang, kind, texts.what)
            assert len(texts.fact) <= 60


# --- every kind, in process: a /proc whose one process cannot be inspected --------------------------

STATUS = "Name:\ttrain\nState:\tS (sleeping)\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n" \
         "Groups:\t\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"


@pytest.fixture
def proc_root(tmp_path):
    """A /proc (captured text) holding one process of uid 65534 whose fd directory cannot be listed;
    self/ is this process's own, for the mount table."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "fd").write_text("")  # not a directory: reading it fails as an unreadable one does
    (proc / "4242" / "stat").write_text("4242 (train) S 1 4242 4242 0 -1 4194560 0 0 0 0\n")
    (proc / "4242" / "status").write_text(STATUS)
    (proc / "self").symlink_to(f"/proc/{os.getpid()}")
    return str(proc)


def _old(path: Path, mode: int, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)
    os.utime(path, (OLD, OLD))
    return path


def _policy(doc: dict):
    from trainguard import config

    return config.parse({"cleanup": [doc]}, "test").cleanup[0]


@pytest.mark.parametrize("dry", [True, False])
def test_every_kind_keeps_what_an_uninspected_process_could_open(tmp_path, proc_root, dry):
    from trainguard.actions.cleanup.runner import CleanupRunner

    age_root, ckpt_root, cache_root = tmp_path / "scratch", tmp_path / "ckpt", tmp_path / "torch"
    private, shared = _old(age_root / "a" / "private.tmp", 0o600), _old(age_root / "a" / "shared.tmp", 0o644)
    for step in (1, 2, 3):  # keep_last 1: steps 1 and 2 are due
        _old(ckpt_root / "run" / f"step{step}.pt", 0o600 if step == 1 else 0o644)
    for unit, mode in (("hub_private", 0o700), ("hub_shared", 0o755)):
        _old(cache_root / unit / "weights.bin", 0o600)
        os.chmod(cache_root / unit, mode)
        os.utime(cache_root / unit, (OLD, OLD))
    policies = [
        _policy({"name": "age", "type": "age", "roots": [str(age_root)], "older_than": "7d", "age_by": ["mtime"],
                 "grace": "0s", "max_delete": "100 files"}),
        _policy({"name": "ckpt", "type": "checkpoints", "roots": [str(ckpt_root)], "keep_last": 1, "grace": "0s"}),
        _policy({"name": "torch", "type": "torch-cache", "roots": [str(cache_root)], "older_than": "7d",
                 "grace": "0s"}),
    ]
    runner = CleanupRunner(policies, proc_root=proc_root, homes=frozenset())
    reports = {p.name: runner.run(p, dry_run=dry) for p in policies}
    for name, report in reports.items():
        assert report.uninspected == 1, name
        assert (report.files, report.skipped.get("unverifiable-open")) == (1, 1), (name, report)
    if not dry:
        assert not private.exists() and shared.exists()
        assert sorted(p.name for p in (ckpt_root / "run").iterdir()) == ["step2.pt", "step3.pt"]
        assert sorted(os.listdir(cache_root)) == ["hub_shared"]
