"""The compiled age loop (actions/cleanup/engine/_agescan.c): the same decisions as the Python loop on
the same trees, and the same attacks the Python loop is tested with, on real files and processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from trainguard.actions.cleanup.engine import agepass
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.safety.inuse import OpenFiles

from tests.support.cli import cli_env
from tests.test_cleanup import DAY, holder, make, names, policy, runner

needs_extension = pytest.mark.skipif(
    not agepass.ENABLED, reason="trainguard.actions.cleanup.engine._agescan is not built (no C compiler at install time)")

ONE_PASS = dict(type="age", age_by=["mtime"], max_delete=False, older_than="3d")


def test_the_extension_is_built_where_ci_installs_the_package():
    if os.environ.get("CI") != "true":
        pytest.skip("only CI promises a C compiler at install time")
    assert agepass.ENABLED, "pip install . built no _agescan: is gcc or the Python headers missing?"


# `python -m trainguard ...` as the CLI runs it, counting the compiled loop's batches in that process.
COUNTED_CLI = """
import atexit, runpy, sys
from trainguard.actions.cleanup.engine import _agescan
batches = []
age_batch = _agescan.age_batch
_agescan.age_batch = lambda *a: batches.append(1) or age_batch(*a)
atexit.register(lambda: print(f"compiled batches: {len(batches)}", file=sys.stderr))
sys.argv[0] = "trainguard"
runpy.run_module("trainguard", run_name="__main__", alter_sys=True)
"""


@needs_extension
def test_the_cli_cleanup_deletes_through_the_compiled_loop(tmp_path):
    root = tmp_path / "scratch"
    _tree(root, 5)
    cfg = tmp_path / "config.toml"
    cfg.write_text(textwrap.dedent(f"""
        [general]
        state_dir = "{tmp_path / 'state'}"
        [filesystems]
        paths = ["{tmp_path}"]
        [[cleanup]]
        name = "scratch"
        type = "age"
        roots = ["{root}"]
        age_by = ["mtime"]
        max_delete = false
        older_than = "3d"
        grace = "0s"
    """))
    mtimes = {str(p.relative_to(root)): p.lstat().st_mtime for p in root.rglob("*") if not p.is_dir()}
    out = subprocess.run([sys.executable, "-c", COUNTED_CLI, "cleanup", "--config", str(cfg)], env=cli_env(),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    batches = int(out.stderr.rsplit("compiled batches: ", 1)[1].split()[0])
    assert batches > 0, "the CLI's cleanup ran the Python loop"
    gone = set(mtimes) - names(root)
    assert gone and "fresh.dat" not in gone and "d0/out.lnk" in gone
    assert all(mtimes[name] < time.time() - 3 * DAY for name in gone)
    assert (tmp_path / f"outside-{root.name}" / "target.dat").exists()


def _tree(root, seed: int) -> None:
    """Everything the rules tell apart: ages on both sides of older_than and grace, excluded names,
    patterns, symlinks (in and out of the root), a fifo, hard links, odd names, nested directories."""
    outside = root.parent / f"outside-{root.name}"
    make(outside / "target.dat")
    for i in range(60):
        sub = root / f"d{i % 4}" / (f"e{i % 3}" if i % 5 else "")
        age = (i * 7919 + seed) % 11 * DAY  # 0..10 days
        make(sub / (f"f{i}.dat" if i % 6 else f"f{i}.lock"), 4096 * (i + 1), age=age)
    make(root / "fresh.dat", age=60 - DAY)  # a minute before the runner's clock (a day ahead): in grace
    os.symlink(outside / "target.dat", root / "d0" / "out.lnk")
    os.symlink("f1.dat", root / "d1" / "in.lnk")
    os.mkfifo(root / "d2" / "pipe")
    os.link(root / "d3" / "f15.dat", root / "d3" / "hard.dat")
    make(root / "d1" / "new\nline.dat", age=9 * DAY)
    make(root / os.fsdecode(b"bad\xff.dat"), age=9 * DAY)
    read = make(root / "d2" / "read.dat", age=9 * DAY)
    os.utime(read, (read.stat().st_mtime + 9 * DAY, read.stat().st_mtime))  # written long ago, read now
    for link in (root / "d0" / "out.lnk", root / "d1" / "in.lnk"):
        os.utime(link, (0, 0), follow_symlinks=False)  # old links: due like files


def _run(tmp_path, monkeypatch, name: str, compiled: bool, dry: bool, **kw):
    root = tmp_path / name
    _tree(root, 3)
    monkeypatch.setattr(agepass, "ENABLED", compiled)
    report = runner(tmp_path, DAY).run(policy(name=name, roots=[str(root)], **kw), dry_run=dry)
    return report, names(root)


POLICIES = {
    "mtime": dict(ONE_PASS),
    "newest-of-three": dict(ONE_PASS, age_by=["atime", "mtime", "ctime"]),
    "atime-and-mtime": dict(ONE_PASS, age_by=["atime", "mtime"]),
    "patterns": dict(ONE_PASS, patterns=["*.dat", "*.lnk"], grace="2h"),
    "path-exclude": dict(ONE_PASS, exclude=["d1/*", "*.lock"], older_than="5d"),
    "empty-dirs": dict(ONE_PASS, remove_empty_dirs=True, older_than="1d"),
}


def _top(report, root) -> list[tuple[int, int, str]]:
    """The top directories, most bytes first; a tie in bytes may come in either order."""
    tops = [(b, f, os.path.relpath(d, root)) for d, b, f in report.top_dirs]
    tied = {b for b, _f, _d in tops if sum(1 for x, _y, _z in tops if x == b) > 1}
    return sorted((b, f, "(tied)" if b in tied else d) for b, f, d in tops)


@needs_extension
@pytest.mark.parametrize("dry", [False, True], ids=["delete", "dry-run"])
@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_the_compiled_loop_decides_as_the_python_loop(tmp_path, monkeypatch, kind, dry):
    fast, left_fast = _run(tmp_path, monkeypatch, "fast", True, dry, **POLICIES[kind])
    slow, left_slow = _run(tmp_path, monkeypatch, "slow", False, dry, **POLICIES[kind])
    assert left_fast == left_slow
    assert (fast.files, fast.bytes, fast.planned_files, fast.dirs_removed) == \
        (slow.files, slow.bytes, slow.planned_files, slow.dirs_removed)
    assert fast.skipped == slow.skipped
    assert _top(fast, tmp_path / "fast") == _top(slow, tmp_path / "slow")
    if not dry:
        assert (tmp_path / "outside-fast" / "target.dat").exists()


@needs_extension
def test_a_name_swapped_for_a_symlink_before_the_batch_loses_the_link_never_the_target(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(root / "a" / "victim.dat")
    precious = make(outside / "precious.dat")

    def hook(event: str, relpath: str) -> None:
        if event == "batch" and relpath == "a":  # listed as a file, judged as whatever is there now
            os.unlink(root / "a" / "victim.dat")
            os.symlink(precious, root / "a" / "victim.dat")
            os.utime(root / "a" / "victim.dat", (0, 0), follow_symlinks=False)

    runner(tmp_path, DAY, hook=hook).run(policy(roots=[str(root)], **ONE_PASS))
    assert precious.read_bytes() == b"x" * 1000
    assert not os.path.lexists(root / "a" / "victim.dat")


@needs_extension
def test_names_swapped_for_symlinks_while_the_loop_runs_never_lose_a_target(tmp_path):
    """A writer racing the single pass: each name flips between an old file and a link to a file
    outside the root. Whatever the interleaving, only names in the root can go."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    precious = [make(outside / f"p{i}.dat") for i in range(50)]
    for i in range(2000):
        make(root / f"f{i:04d}.dat")
    stop = threading.Event()

    def flip() -> None:
        i = 0
        while not stop.is_set():
            name = root / f"f{i % 2000:04d}.dat"
            tmp = root / f".swap{i % 2000}"
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                os.symlink(precious[i % 50], tmp)
                os.utime(tmp, (0, 0), follow_symlinks=False)
                os.replace(tmp, name)
            i += 7

    racer = threading.Thread(target=flip)
    racer.start()
    try:
        runner(tmp_path, DAY).run(policy(roots=[str(root)], **dict(ONE_PASS, exclude=[])))
    finally:
        stop.set()
        racer.join()
    assert all(p.read_bytes() == b"x" * 1000 for p in precious)


@needs_extension
def test_a_file_opened_between_batches_stays_and_names_its_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(agepass, "READ_BYTES", 1024)  # ~30 names a batch: several in one directory
    root = tmp_path / "root"
    files = [make(root / f"f{i:03d}.dat") for i in range(100)]
    now = [0.0]
    batches, held = [], []

    def hook(event: str, relpath: str) -> None:
        if event != "batch":
            return
        batches.append(relpath)
        if len(batches) == 2:  # the index was built before the run; a file not yet judged is opened now
            target = next(p for p in files if p.exists())
            held.append((target, stack.enter_context(holder(target, "open"))))
            now[0] += 2.0  # older than max_age (1 s): the next batch reads /proc again

    with contextlib.ExitStack() as stack:
        report = runner(tmp_path, DAY, hook=hook, open_files=OpenFiles(clock=lambda: now[0])).run(
            policy(roots=[str(root)], **ONE_PASS))
    (target, proc), = held
    assert len(batches) >= 3 and names(root) == {target.name}
    assert report.skipped["open"] == 1 and f"PID {proc.pid}" in report.holders[0]


@needs_extension
def test_a_dry_run_counts_an_open_file_as_kept_whatever_its_age(tmp_path):
    root = tmp_path / "root"
    held = make(root / "held.dat", age=DAY)  # young, and open
    make(root / "old.dat")
    with holder(held, "open") as proc:
        report = runner(tmp_path, DAY).run(policy(roots=[str(root)], **ONE_PASS), dry_run=True)
    assert (report.files, report.skipped) == (1, {"open": 1})
    assert f"PID {proc.pid}" in report.holders[0] and len(names(root)) == 2


@needs_extension
def test_an_unlink_refused_by_the_kernel_is_reported_and_the_run_goes_on(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for chattr +i (an immutable file)")
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr (e2fsprogs)")
    root = tmp_path / "root"
    locked = make(root / "locked.dat")
    make(root / "free.dat")
    if os.system(f"chattr +i {locked} 2>/dev/null") != 0:
        pytest.skip(f"{tmp_path} does not support immutable files")
    try:
        report = runner(tmp_path, DAY).run(policy(roots=[str(root)], **ONE_PASS))
    finally:
        os.system(f"chattr -i {locked}")
    assert names(root) == {"locked.dat"} and report.files == 1 and report.planned_files == 2
    assert report.skipped == {"permission": 1}


def test_audit_rows_written_behind_land_in_order_and_a_failed_write_is_raised(tmp_path):
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    audit = AuditLog(conn, batch=3)
    for i in range(10):
        audit.record("p", "/data", f"/data/f{i}", i, 1, "age")
    audit.flush()
    assert [p for (p,) in conn.execute("SELECT path FROM cleanup_log ORDER BY rowid")] == [f"/data/f{i}" for i in range(10)]
    assert conn.execute("SELECT files, bytes FROM cleanup_totals").fetchone() == (10, 45)
    conn.execute("DROP TABLE cleanup_log")  # the next batch cannot be written
    for i in range(3):
        audit.record("p", "/data", f"/data/g{i}", 1, 1, "age")
    with pytest.raises(sqlite3.OperationalError, match="cleanup_log"):
        audit.flush()


GUARDED = {"one pass": dict(max_delete=False), "remembered": dict(max_delete=10000),
           "walked again": dict(max_delete=10000)}


@pytest.mark.parametrize("compiled", [False, True], ids=["python-judge", "compiled-judge"])
@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_a_guarded_run_deletes_what_the_one_pass_deletes(tmp_path, monkeypatch, kind, compiled):
    """The guarded run counts and remembers what is due, then deletes only that (remembered.py); past
    its memory budget it walks again. Both leave the tree the single pass leaves, empty directories
    removed alike, with the same counts."""
    from trainguard.actions.cleanup.engine import remembered

    if compiled and not agepass.ENABLED:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    results = {}
    for mode, guard in GUARDED.items():
        monkeypatch.setattr(remembered, "BUDGET", 0 if mode == "walked again" else 16 << 20)
        report, left = _run(tmp_path, monkeypatch, mode.replace(" ", "-"), compiled, False,
                            **dict(POLICIES[kind], **guard))
        results[mode] = (left, report.files, report.bytes, report.planned_files if guard["max_delete"] else None,
                         report.dirs_removed, report.guard)
    one = results.pop("one pass")
    for mode, got in results.items():
        assert got[:3] == one[:3] and got[4:] == one[4:], mode
        assert got[3] == one[1], mode  # the count is what went
    assert (one[1] > 0 or kind == "newest-of-three") and (one[4] > 0 or kind != "empty-dirs")  # ctimes: now
