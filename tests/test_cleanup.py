"""Cleanup policies on real directory trees, real processes and (as root) real mounts."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from trainguard import config
from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import agepass
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.runner import CleanupReport, CleanupRunner, RootReport, findings_for
from trainguard.actions.cleanup.safety.roots import UnsafeRoot, open_checked_root
from trainguard.actions.cleanup.worker import Scheduler
from trainguard.records import FsSample, Mount, MountKind, Severity, Snapshot
from trainguard.sources.fs import usage_from_statvfs

from tests.support.fake_daemon import Recorder

DAY = 86400.0
NOW = time.time()


def policy(**kw):
    kw.setdefault("name", "p")
    return config.parse({"cleanup": [kw]}, "test").cleanup[0]


def make(path: Path, size: int = 1000, age: float = 30 * DAY) -> Path:
    """A file `age` seconds old now: by the clock at this call, as the runner's clock (time.time() at its
    run) reads it, not by an instant taken when the module was imported: in a whole suite that instant is
    minutes old by the time a test runs, and a file made "a minute ago" would have left its grace period."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    now = time.time()
    os.utime(path, (now - age, now - age))
    return path


def runner(tmp_path: Path, clock_offset: float = 0.0, **kw) -> CleanupRunner:
    kw.setdefault("homes", frozenset({"/root"}))
    return CleanupRunner([], clock=lambda: time.time() + clock_offset, **kw)


def listing(root: Path) -> list[tuple]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            st = os.lstat(os.path.join(dirpath, name))
            out.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns, st.st_ino))
    return sorted(out)


def names(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ------------------------------------------------------------------ config safety


@pytest.mark.parametrize("root", ["/", "/home", "/etc", "/usr", "/root", "/home/alice", "/usr/local/x", "relative/dir"])
def test_config_refuses_dangerous_roots_naming_the_policy(root):
    with pytest.raises(config.ConfigError) as err:
        config.parse({"cleanup": [{"name": "oops", "type": "age", "roots": [root]}]}, "cfg.toml")
    assert "oops" in str(err.value) and "cfg.toml" in str(err.value)


def test_default_config_has_tmp_instance_switched_off():
    (tmp,) = config.parse({}, "defaults").cleanup
    assert (tmp.name, tmp.type, tmp.roots, tmp.older_than, tmp.enabled) == ("tmp", "age", ["/tmp"], DAY, False)


def test_symlinked_root_is_refused(tmp_path):
    real = tmp_path / "real"
    make(real / "old.pt")
    pol = policy(type="age", roots=[str(tmp_path / "link")], age_by=["mtime"])  # the link comes after loading
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeRoot, match="symlink"):
        open_checked_root(str(tmp_path / "link"), frozenset())
    r = runner(tmp_path, DAY)
    report = r.run(pol)
    assert report.files == 0 and "symlink" in report.roots[0].note
    assert (real / "old.pt").exists()


# ------------------------------------------------------------------ checkpoints


def test_step_parsing():
    assert sel.parse_step("checkpoint-1500") == 1500
    assert sel.parse_step("epoch=3-step=1500.ckpt") == 1500
    assert sel.parse_step("global_step800") == 800
    assert sel.parse_step("model_120.pth") == 120
    assert sel.parse_step("model_best.pth") is None
    assert sel.parse_step("run3_epoch10.pth") == 10
    assert sel.parse_step("pytorch_model-00001-of-00002.bin") is None


def test_keep_last_per_run_group_by_step_not_mtime(tmp_path):
    root = tmp_path / "runs"
    # mtimes run against the step order: keep_last must follow the steps.
    for i, step in enumerate([100, 200, 300, 400, 500, 600, 700, 800]):
        make(root / "a" / f"ckpt_step{step}.pt", age=DAY + i * 60)
    for epoch in (1, 2, 3):
        make(root / "b" / f"epoch_{epoch}.pth")
    r = runner(tmp_path, DAY)
    report = r.run(policy(type="checkpoints", roots=[str(root)], keep_last=5))
    # step100 was written last (a restarted run saves it again): the newest by time stays as well.
    assert names(root / "a") == {f"ckpt_step{s}.pt" for s in (100, 400, 500, 600, 700, 800)}
    assert names(root / "b") == {"epoch_1.pth", "epoch_2.pth", "epoch_3.pth"}
    assert report.files == 2 and all("keep_last=5" in item.reason for item in report.items)


def test_keep_every_and_older_than(tmp_path):
    root = tmp_path / "runs"
    for epoch in range(1, 13):
        make(root / "r" / f"epoch{epoch}.pth", age=DAY * (20 - epoch))
    r = runner(tmp_path, DAY)
    r.run(policy(type="checkpoints", roots=[str(root)], keep_last=2, keep_every=5, older_than="10d"))
    # 11,12 kept by keep_last; 5,10 by keep_every; 10..12 are younger than 10 days anyway.
    assert names(root / "r") == {f"epoch{e}.pth" for e in (5, 10, 11, 12)}


def test_checkpoint_directories_are_units(tmp_path):
    root = tmp_path / "out"
    for step in (500, 1000, 1500, 2000):
        d = root / "run" / f"checkpoint-{step}"
        make(d / "pytorch_model.bin", 5000)
        make(d / "optimizer.pt", 3000)
        make(d / "trainer_state.json", 10)
    make(root / "run" / "config.json", 10)
    r = runner(tmp_path, DAY)
    report = r.run(policy(type="checkpoints", roots=[str(root)], keep_last=2))
    assert names(root / "run") >= {"checkpoint-1500", "checkpoint-2000", "config.json"}
    assert not (root / "run" / "checkpoint-500").exists() and not (root / "run" / "checkpoint-1000").exists()
    assert report.files == 6 and {i.unit for i in report.items} == {True}


def test_checkpoint_being_written_is_kept_and_does_not_count(tmp_path):
    root = tmp_path / "runs"
    for step in (1, 2, 3, 4):
        make(root / "r" / f"step{step}.pt")
    # The clock runs an hour ahead, so the files just created are an hour old;
    # step5 was written a minute "ago": it is still being saved.
    make(root / "r" / "step5.pt", age=-3600 + 60)
    r = runner(tmp_path, 3600)
    r.run(policy(type="checkpoints", roots=[str(root)], keep_last=2, grace="10m"))
    # keep_last=2 keeps two complete checkpoints besides the one in progress.
    assert names(root / "r") == {"step3.pt", "step4.pt", "step5.pt"}
    r.run(policy(type="checkpoints", roots=[str(root)], keep_last=1, grace="2h"))
    assert names(root / "r") == {"step3.pt", "step4.pt", "step5.pt"}  # all inside the grace period


def test_newest_checkpoint_survives_even_with_an_unnumbered_sibling(tmp_path):
    root = tmp_path / "runs"
    make(root / "r" / "model_best.pth", age=DAY)
    make(root / "r" / "model_final.pth", age=5 * DAY)
    make(root / "r" / "model_old.pth", age=9 * DAY)
    runner(tmp_path, DAY).run(policy(type="checkpoints", roots=[str(root)], keep_last=1))
    assert names(root / "r") == {"model_best.pth"}


# ------------------------------------------------------------------ the open-file and grace rules


@contextlib.contextmanager
def holder(path: Path, how: str):
    code = {
        "open": f"f = open({str(path)!r}, 'rb')",
        "mmap": f"import mmap; f = open({str(path)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); f.close()",
    }[how]
    proc = subprocess.Popen([sys.executable, "-c", code + "\nprint('ready', flush=True)\nimport sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(10)


@pytest.mark.parametrize("how", ["open", "mmap"])
def test_file_held_by_another_process_is_not_deleted(tmp_path, how):
    root = tmp_path / "scratch"
    held = make(root / "held.dat", 4096)
    free = make(root / "free.dat", 4096)
    with holder(held, how):
        report = runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"], older_than="1d"))
        assert held.exists() and not free.exists()
        assert report.skipped.get("open") == 1
    report = runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"], older_than="1d"))
    assert not held.exists()


def test_grace_period_protects_recent_writes(tmp_path):
    root = tmp_path / "scratch"
    make(root / "old.dat", age=3 * DAY)
    report = runner(tmp_path).run(policy(type="age", roots=[str(root)], age_by=["mtime"], older_than="1d", grace="10m"))
    # Its ctime is now (it was just created): it may be a file being renamed into place.
    assert (root / "old.dat").exists() and report.skipped == {"grace": 1}


# ------------------------------------------------------------------ symlinks and races


def test_symlink_to_outside_is_never_followed(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    precious = make(outside / "precious.pt")
    make(outside / "sub" / "deep.pt")
    root.mkdir()
    (root / "dirlink").symlink_to(outside)
    (root / "filelink.pt").symlink_to(precious)
    os.utime(root / "filelink.pt", (NOW - 30 * DAY, NOW - 30 * DAY), follow_symlinks=False)
    r = runner(tmp_path, DAY)
    r.run(policy(type="checkpoints", roots=[str(root)], keep_last=1))
    r.run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
    assert precious.exists() and (outside / "sub" / "deep.pt").exists()
    assert not (root / "filelink.pt").is_symlink()  # the stale link itself may go, never its target


def test_directory_swapped_for_symlink_during_scan_is_not_followed(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(outside / "victim.dat")
    make(root / "sub" / "old.dat")

    def swap(event, path):
        if event == "open_dir" and path == "sub":
            (root / "sub").rename(tmp_path / "moved")
            (root / "sub").symlink_to(outside)

    report = runner(tmp_path, DAY, hook=swap).run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
    assert (outside / "victim.dat").exists()
    assert report.skipped.get("symlink") == 1


def test_parent_swapped_for_symlink_just_before_delete_cannot_redirect_it(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(outside / "ckpt_1.pt")
    for step in (1, 2):
        make(root / "run" / f"ckpt_{step}.pt")

    def swap(event, path):
        if event == "before_delete":
            (root / "run").rename(tmp_path / "moved")
            (root / "run").symlink_to(outside)

    runner(tmp_path, DAY, hook=swap).run(policy(type="checkpoints", roots=[str(root)], keep_last=1))
    # The unlink happened relative to the directory fd that was judged, i.e. in the moved dir.
    assert (outside / "ckpt_1.pt").exists()
    assert names(tmp_path / "moved") == {"ckpt_2.pt"}


@pytest.mark.parametrize("compiled", [False, True], ids=["python-judge", "compiled-judge"])
def test_file_vanishing_between_scan_and_delete_is_skipped(tmp_path, monkeypatch, compiled):
    if compiled and not agepass.ENABLED:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", compiled)
    root = tmp_path / "root"
    for i in range(3):
        make(root / f"f{i}.dat")
    batches = []

    def vanish(event, path):
        # The Python judge: just before the unlink; the compiled one: before the deleting pass's
        # batch (the counting pass read the directory first).
        if event == "batch":
            batches.append(path)
        if (event == "before_delete" and path == "f1.dat") or (compiled and event == "batch" and len(batches) == 2):
            (root / "f1.dat").unlink()

    report = runner(tmp_path, DAY, hook=vanish).run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
    assert names(root) == set() and report.files == 2 and report.skipped == {"vanished": 1}


def _on_second_open(path: str, action):
    """A hook running action when the delete pass reopens directory `path` (the plan pass opened it first)."""
    seen = []

    def hook(event, where):
        if event == "open_dir" and where == path:
            seen.append(where)
            if len(seen) == 2:
                action()

    return hook


def test_file_rewritten_between_plan_and_delete_is_kept(tmp_path):
    root = tmp_path / "root"
    for i in range(3):
        make(root / "sub" / f"f{i}.dat")
    # Written in place: the directory itself does not change, only the file's mtime.
    hook = _on_second_open("sub", lambda: (root / "sub" / "f1.dat").write_bytes(b"fresh"))
    report = runner(tmp_path, hook=hook).run(
        policy(type="age", roots=[str(root)], age_by=["mtime"], older_than="1d", grace="0s"))
    assert names(root) == {"sub", "sub/f1.dat"} and report.files == 2


def test_directory_changed_between_plan_and_delete_is_judged_afresh(tmp_path):
    root = tmp_path / "root"
    for i in range(6):
        make(root / "sub" / f"f{i}.dat", age=30 * DAY if i != 3 else 0)

    def change():  # shifts the listing positions the plan marked
        (root / "sub" / "f0.dat").unlink()
        for i in range(4):
            make(root / "sub" / f"g{i}.dat")  # created during the run: changed after it started, kept

    report = runner(tmp_path, hook=_on_second_open("sub", change)).run(
        policy(type="age", roots=[str(root)], age_by=["mtime"], older_than="1d", grace="0s"))
    assert names(root) == {"sub", "sub/f3.dat"} | {f"sub/g{i}.dat" for i in range(4)}
    assert report.files == 4


def test_permission_denied_on_a_subtree_is_skipped(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to drop the permission-override capabilities")
    root = tmp_path / "root"
    make(root / "open" / "old.dat")
    make(root / "locked" / "old.dat")
    os.chown(root / "locked", 65534, 65534)
    os.chmod(root / "locked", 0o700)
    # Root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH is refused like any other user.
    script = textwrap.dedent(f"""
        import time
        from trainguard import config
        from trainguard.actions.cleanup.runner import CleanupRunner
        pol = config.parse({{"cleanup": [{{"name": "p", "type": "age", "roots": [{str(root)!r}], "age_by": ["mtime"]}}]}}, "t").cleanup[0]
        rep = CleanupRunner([], homes=frozenset(), clock=lambda: time.time() + 86400).run(pol)
        print(rep.files, rep.skipped.get("permission"))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "daemon")}
    out = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
                          "-dac_override,-dac_read_search", sys.executable, "-c", script],
                         env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "setpriv" in out.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]
    assert not (root / "open" / "old.dat").exists() and (root / "locked" / "old.dat").exists()


# ------------------------------------------------------------------ guard, dry run, audit, findings


def test_max_delete_guard_stops_before_deleting_anything(tmp_path):
    root = tmp_path / "data"
    for i in range(20):
        make(root / f"shard{i:03d}.dat")
    before = listing(root)
    report = runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"], max_delete=10))
    assert listing(root) == before and report.files == 0 and report.planned_files == 20
    (finding,) = findings_for(report)
    assert finding.key == "cleanup.guard:p" and finding.severity is Severity.WARNING
    assert "max_delete" in finding.summary and "nothing" in finding.summary
    report = runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"], max_delete="1MiB"))
    assert report.files == 20


def test_dry_run_touches_nothing_and_lists_everything(tmp_path):
    root = tmp_path / "root"
    for step in range(1, 9):
        make(root / "run" / f"checkpoint-{step}" / "model.safetensors", 2048)
    make(root / "tmp" / "old.dat", 4096)
    before = listing(root)
    seen = []
    r = runner(tmp_path, DAY)
    ck = r.run(policy(type="checkpoints", roots=[str(root)], keep_last=3), dry_run=True, on_item=seen.append)
    age = r.run(policy(type="age", roots=[str(root / "tmp")], age_by=["mtime"]), dry_run=True)
    assert listing(root) == before
    assert ck.dry_run and ck.files == 5 and len(seen) == 5 and ck.bytes == 5 * 4096
    assert [os.path.basename(i.path) for i in seen] == [f"checkpoint-{s}" for s in range(1, 6)]
    assert age.files == 1 and findings_for(ck) == []


def test_checkpoints_saved_within_one_timestamp_tick_go_in_step_order(tmp_path):
    root = tmp_path / "root"
    for step in range(1, 9):
        make(root / "run" / f"checkpoint-{step}" / "model.safetensors", 2048)
    tick = time.time() - DAY
    for step in range(1, 9):
        os.utime(root / "run" / f"checkpoint-{step}", (tick, tick))
    seen = []
    runner(tmp_path, DAY).run(policy(type="checkpoints", roots=[str(root)], keep_last=3), dry_run=True,
                              on_item=seen.append)
    assert [os.path.basename(i.path) for i in seen] == [f"checkpoint-{s}" for s in range(1, 6)]


def test_deletions_are_audited_and_reported(tmp_path):
    root = tmp_path / "runs"
    for step in range(1, 8):
        make(root / "r" / f"step{step}.pt", 8192)
    conn = sqlite3.connect(tmp_path / "state.db")
    audit = AuditLog(conn)
    report = runner(tmp_path, DAY, audit=audit).run(policy(name="ckpt", type="checkpoints", roots=[str(root)], keep_last=5))
    rows = audit.entries("ckpt")
    assert sorted(os.path.basename(r[2]) for r in rows) == ["step1.pt", "step2.pt"]
    assert all(r[3] == 8192 and "keep_last" in r[4] for r in rows)
    (freed,) = audit.freed()
    assert (freed.policy, freed.files_24h, freed.bytes_24h, freed.files_total) == ("ckpt", 2, 16384, 2)
    (finding,) = findings_for(report)
    assert finding.key == "cleanup.report:ckpt" and finding.severity is Severity.INFO
    assert finding.summary.startswith("cleanup freed 16.0 KiB on ") and "(ckpt: 2 files)" in finding.summary


# ------------------------------------------------------------------ age details and caches


def test_age_policy_excludes_and_removes_empty_dirs(tmp_path):
    root = tmp_path / "tmp"
    make(root / ".X11-unix" / "X0")
    make(root / "app.lock")
    make(root / "systemd-private-abc" / "tmp" / "f")
    make(root / "job" / "nested" / "old.dat")
    make(root / "fresh.dat", age=-DAY / 2)  # half a day old by the runner's clock
    for d in (root / "job" / "nested", root / "job"):
        os.utime(d, (NOW - 30 * DAY, NOW - 30 * DAY))
    runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
    assert names(root) == {".X11-unix", ".X11-unix/X0", "app.lock", "systemd-private-abc",
                           "systemd-private-abc/tmp", "systemd-private-abc/tmp/f", "fresh.dat"}


def test_cache_dirs_located_like_the_tools():
    env = {"PIP_CACHE_DIR": "/data/pipcache", "HF_HOME": "/data/hf", "XDG_CACHE_HOME": "/x"}
    homes = ["/home/alice", "/root"]
    assert sel.cache_dirs("pip-cache", env, homes, as_root=True, own_home="/root") == [
        "/data/pipcache", "/home/alice/.cache/pip", "/root/.cache/pip"]
    assert sel.cache_dirs("huggingface-cache", env, [], as_root=False, own_home="/root") == [
        "/data/hf/hub", "/data/hf/xet"]  # the hub cache and the xet chunk cache
    assert sel.cache_dirs("torch-cache", env, [], as_root=False, own_home="/root") == ["/x/torch/hub"]


def test_huggingface_cache_units_size_cap_and_held_lock(tmp_path):
    hub = tmp_path / "hf" / "hub"
    for i, age in enumerate((40, 20, 5)):
        make(hub / f"models--org--m{i}" / "blobs" / "abc", 100_000, age=age * DAY)
        os.utime(hub / f"models--org--m{i}" / "blobs" / "abc", (NOW - age * DAY, NOW - age * DAY))
    lock = make(hub / ".locks" / "models--org--m2" / "abc.lock", 0)
    env = {"HF_HUB_CACHE": str(hub), "HOME": str(tmp_path)}
    pol = policy(type="huggingface-cache", max_size="150KB", all_users=False)
    with holder(lock, "open"):
        report = runner(tmp_path, DAY, environ=env).run(pol)
        assert report.files == 0 and "in use" in report.roots[0].note
    report = runner(tmp_path, DAY, environ=env).run(pol)
    # 3 x ~100 KB against a 150 KB cap: the two oldest models go, as whole units.
    assert {p.name for p in hub.iterdir()} == {".locks", "models--org--m2"}
    assert report.files == 2


# ------------------------------------------------------------------ watermark (real filesystem that fills)


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_watermark_deletes_oldest_first_and_stops_at_low(tmp_path):
    with tmpfs(tmp_path / "fs", "16m") as fs:
        for i in range(14):  # 14 x 1 MiB of 16 MiB: 87.5 % used
            make(fs / "runs" / f"old{i:02d}.dat", 1 << 20, age=(100 - i) * DAY)
        pol = policy(type="age", roots=[str(fs / "runs")], age_by=["mtime"], watermark=True, high="85%", low="60%")
        used = usage_from_statvfs(os.statvfs(fs)).used_ratio
        assert used >= 0.85
        report = runner(tmp_path, DAY).run(pol, trigger="watermark")
        after = usage_from_statvfs(os.statvfs(fs)).used_ratio
        assert 0.5 < after <= 0.60
        # the oldest went first, and it stopped as soon as it reached low
        assert names(fs / "runs") == {f"old{i:02d}.dat" for i in range(14 - len(names(fs / "runs")), 14)}
        assert report.roots[0].usage_after == pytest.approx(after)
        # below high: a manual run of a watermark-only policy deletes nothing
        again = runner(tmp_path, DAY).run(pol)
        assert again.files == 0 and "watermark" in again.roots[0].note


def test_watermark_checkpoints_keep_protected_ones(tmp_path):
    with tmpfs(tmp_path / "fs", "16m") as fs:
        for step in range(1, 15):
            make(fs / "run" / f"step{step}.pt", 1 << 20, age=(100 - step) * DAY)
        pol = policy(type="checkpoints", roots=[str(fs)], keep_last=12, watermark=True, high="80%", low="10%")
        report = runner(tmp_path, DAY).run(pol, trigger="watermark")
        assert names(fs / "run") == {f"step{s}.pt" for s in range(3, 15)} and report.files == 2


def test_mounts_below_a_root_are_not_crossed(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    make(outside / "bound.dat")
    make(root / "mine.dat")
    (root / "bind").mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to bind mount")
    res = subprocess.run(["mount", "--bind", str(outside), str(root / "bind")], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot bind mount: {res.stderr.strip()}")
    try:
        with tmpfs(root / "other", "1m") as other:
            make(other / "other.dat")
            runner(tmp_path, DAY).run(policy(type="age", roots=[str(root)], age_by=["mtime"]))
            assert (other / "other.dat").exists()
        assert (outside / "bound.dat").exists() and not (root / "mine.dat").exists()
    finally:
        subprocess.run(["umount", "-l", str(root / "bind")], check=False)


def test_scheduler_triggers_watermark_from_snapshot(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    pol = policy(type="age", roots=[str(root)], watermark=True, high="85%")
    r = CleanupRunner([pol], homes=frozenset())
    mount = Mount(str(tmp_path), "ext4", "/dev/x", 8, 1, MountKind.LOCAL)

    def snap(used):
        from trainguard.records import FsUsage
        return Snapshot(NOW, (FsSample(mount, NOW, FsUsage(100, used, 100 - used, 0, 0, 0)),))

    s = Scheduler(r, statvfs=lambda p: pytest.fail("must use the snapshot"))
    assert s.due(snap(50), NOW) == []
    assert s.due(snap(90), NOW) == [(pol, "watermark")]


def test_a_due_watermark_wins_over_a_due_schedule_which_stays_due(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    pol = policy(type="age", roots=[str(root)], watermark=True, high="85%", low="80%", schedule="1d")
    r = CleanupRunner([pol], homes=frozenset())
    mount = Mount(str(tmp_path), "ext4", "/dev/x", 8, 1, MountKind.LOCAL)

    def snap(used):
        from trainguard.records import FsUsage
        return Snapshot(NOW, (FsSample(mount, NOW, FsUsage(100, used, 100 - used, 0, 0, 0)),))

    s = Scheduler(r, statvfs=lambda p: pytest.fail("must use the snapshot"))
    assert s.due(snap(90), NOW) == [(pol, "watermark")]  # both due: the emergency first
    done = CleanupReport(policy=pol.name, type=pol.type, trigger="watermark", dry_run=False, started=NOW,
                         finished=NOW, roots=(RootReport(str(root), str(tmp_path), 5, 10, 0.9, 0.79),), files=5,
                         bytes=10, needed_bytes=10)
    s.ran(done, NOW)
    assert s.due(snap(79), NOW + 1) == [(pol, "schedule")]  # a watermark run is not the schedule's run
    assert s.due(snap(50), NOW) == [(pol, "schedule")]


# ------------------------------------------------------------------ daemon, CLI, status


def test_daemon_runs_cleanup_off_the_cycle_and_alerts_what_it_freed(tmp_path):
    from trainguard.service.daemon import Daemon

    root = tmp_path / "scratch"
    for i in range(3):
        make(root / f"old{i}.dat", 4096, age=10 * DAY)
    cfg = config.parse({
        "general": {"state_dir": str(tmp_path / "state")},
        "cleanup": [{"name": "scratch", "type": "age", "roots": [str(root)], "age_by": ["mtime"],
                     "schedule": "1h", "grace": "0s"}],
    }, "test")
    recorder = Recorder()
    daemon = Daemon(config.Loaded(cfg, "test"), notifiers=[recorder])
    try:
        daemon.cycle()
        deadline = time.monotonic() + 20
        while not daemon.cleanup.reports and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.cleanup.reports, "the cleanup worker never ran"
        daemon.cycle()
    finally:
        daemon.close()
    assert names(root) == set()
    (event,) = [e for e in recorder.events if e.finding.key == "cleanup.report:scratch"]
    assert "cleanup freed" in event.finding.summary and "(scratch: 3 files)" in event.finding.summary
    conn = sqlite3.connect(tmp_path / "state" / "state.db")
    assert conn.execute("SELECT COUNT(*) FROM cleanup_audit WHERE policy = 'scratch'").fetchone() == (3,)


def run_cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "daemon")}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_cleanup_dry_run_then_real_run_then_status(tmp_path):
    root = tmp_path / "runs"
    for step in range(1, 8):
        make(root / "r" / f"step{step}.pt", 4096)
    cfg = tmp_path / "config.toml"
    cfg.write_text(textwrap.dedent(f"""
        [general]
        state_dir = "{tmp_path / 'state'}"
        [filesystems]
        paths = ["{tmp_path}"]
        [[cleanup]]
        name = "ckpt"
        type = "checkpoints"
        roots = ["{root}"]
        keep_last = 4
        grace = "0s"
    """))
    before = listing(root)
    dry = run_cli(tmp_path, "cleanup", "--config", str(cfg), "--dry-run", "--verbose", "--policy", "ckpt")
    assert dry.returncode == 0, dry.stderr
    assert listing(root) == before
    assert dry.stdout.count("would delete") == 3 and "step1.pt" in dry.stdout and "keep_last=4" in dry.stdout
    assert "would free 48.0 KiB" in dry.stdout or "would free 12.0 KiB" in dry.stdout
    real = run_cli(tmp_path, "cleanup", "--config", str(cfg))
    assert real.returncode == 0, real.stderr
    assert names(root / "r") == {f"step{s}.pt" for s in (4, 5, 6, 7)}
    unknown = run_cli(tmp_path, "cleanup", "--config", str(cfg), "--policy", "nope")
    assert unknown.returncode == 2 and "ckpt" in unknown.stderr
    status = run_cli(tmp_path, "status", "--config", str(cfg), "--json")
    assert status.returncode == 0, status.stderr
    import json
    (entry,) = json.loads(status.stdout)["cleanup"]
    assert entry["policy"] == "ckpt" and entry["freed_files_total"] == 3 and entry["freed_files_24h"] == 3
