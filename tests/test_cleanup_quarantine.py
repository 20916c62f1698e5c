"""Deleting by quarantine (actions/cleanup/engine/quarantine.py): a file renamed over a judged name between
the judge's lstat and the delete is put back, never deleted, by both judges, on a filesystem with
RENAME_NOREPLACE and on one without (FUSE); max_delete and the audit count only what went; a
private name left by an interrupted run is finished by the next."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest
from trainguard.actions.cleanup.engine import agepass, quarantine
from trainguard.actions.cleanup.record.audit import AuditLog

from tests.test_cleanup import DAY, make, names, policy, runner

BUILT = agepass.ENABLED  # before any test turns it off
MODES = {"one-pass": dict(max_delete=False), "guarded": dict(max_delete=None)}  # None: the count exactly
AGE = dict(type="age", age_by=["mtime"], older_than="3d", grace="0s")


def _judge(monkeypatch, judge: str) -> None:
    if judge == "compiled" and not BUILT:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", judge == "compiled")


def _race(tmp_path, root, mode: str, races: int, dirs: int = 4):
    """2 * races old files; just before each odd one is deleted, a new file is renamed over its name
    (an atomic save). Returns (report, audit paths, {raced path: what was renamed in})."""
    for i in range(2 * races):
        make(root / f"d{i % dirs}" / f"f{i:04d}.dat")
    raced = {}

    def hook(event: str, relpath: str) -> None:
        if event == "before_delete" and int(relpath[-8:-4]) % 2:
            path = root / relpath
            tmp = path.with_name(".save.tmp")
            raced[relpath] = f"saved over {relpath}".encode()
            tmp.write_bytes(raced[relpath])
            os.utime(tmp, (0, 0))  # as old as the one judged: due too, had it been judged
            os.replace(tmp, path)

    conn = sqlite3.connect(tmp_path / f"{root.name}.db", isolation_level=None)
    guard = MODES[mode]["max_delete"]
    report = runner(tmp_path, DAY, hook=hook, audit=AuditLog(conn)).run(policy(
        roots=[str(root)], **dict(AGE, max_delete=2 * races if guard is None else guard)))
    rows = sorted(os.path.relpath(p, root) for (p,) in conn.execute("SELECT path FROM cleanup_audit"))
    conn.close()
    return report, rows, raced


@pytest.mark.parametrize("judge", ["compiled", "python"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_file_renamed_over_a_judged_name_is_never_deleted(tmp_path, monkeypatch, mode, judge):
    """200 races per judge and mode, each at the worst moment: after the judge's lstat, before the delete."""
    _judge(monkeypatch, judge)
    root = tmp_path / "root"
    report, rows, raced = _race(tmp_path, root, mode, 200)
    assert len(raced) == 200
    victims = [p for p, data in raced.items() if not (root / p).exists() or (root / p).read_bytes() != data]
    assert victims == []
    left = {n for n in names(root) if "." in n}
    assert left == set(raced)  # every file not raced went, and no private name is left behind
    assert report.files == len(rows) == 200 and report.skipped == {"changed": 200} and not report.guard
    assert set(rows) == {f"d{i % 4}/f{i:04d}.dat" for i in range(0, 400, 2)}  # the audit: what went, only


@pytest.mark.parametrize("judge", ["compiled", "python"])
def test_where_the_filesystem_has_no_rename_noreplace_placeholders_keep_it_safe(tmp_path, monkeypatch, slowfs,
                                                                                judge):
    """FUSE without RENAME_NOREPLACE (EINVAL): the private name is created first (O_EXCL), then renamed over."""
    _judge(monkeypatch, judge)
    root = slowfs.mountpoint / "root"
    fd = os.open(slowfs.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (slowfs.mountpoint / "probe").write_bytes(b"")
        with pytest.raises(OSError) as err:
            quarantine._rename_noreplace(fd, "probe", "probe2")
        assert err.value.errno == 22  # EINVAL: this filesystem takes the placeholder way
    finally:
        os.close(fd)
    report, rows, raced = _race(tmp_path, root, "one-pass", 15, dirs=2)
    assert all((root / p).read_bytes() == data for p, data in raced.items())
    assert {n for n in names(root) if "." in n} == set(raced)
    assert report.files == len(rows) == 15 and report.skipped == {"changed": 15}


@pytest.mark.parametrize("judge", ["compiled", "python"])
def test_a_private_name_left_by_an_interrupted_run_is_finished_by_the_next(tmp_path, monkeypatch, judge):
    _judge(monkeypatch, judge)
    root = tmp_path / "root"
    leftover = make(root / "run1" / f"{quarantine.PREFIX}4d2.0")  # judged, renamed, then the process died
    make(root / "run1" / "model.pt")
    notes = make(root / "run1" / "notes.txt")
    report = runner(tmp_path, DAY).run(policy(roots=[str(root)], patterns=["*.pt"], max_delete=False, **AGE))
    assert not leftover.exists() and notes.exists() and names(root) == {"run1", "run1/notes.txt"}
    assert report.files == 2


def test_both_judges_use_one_private_prefix():
    if not BUILT:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    from trainguard.actions.cleanup.engine import _agescan

    assert _agescan.PRIVATE_PREFIX == quarantine.PREFIX


@pytest.mark.parametrize("judge", ["compiled", "python"])
def test_an_entry_verified_but_never_unlinked_is_not_counted_and_the_next_run_finishes_it(tmp_path, monkeypatch,
                                                                                          judge):
    """The entry verified last waits under the private name for the next rename onto it, or the batch's
    last unlink. When those fail (here: the directory turned append-only), it is not counted nor audited
    as gone; the next run finds the private name and deletes it."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr (e2fsprogs) for an append-only directory")
    _judge(monkeypatch, judge)
    root = tmp_path / "root"
    for i in range(3):
        make(root / "d" / f"f{i}.dat")
    seen = []

    def hook(event: str, relpath: str) -> None:
        if event != "before_delete":
            return
        seen.append(relpath)
        if len(seen) == 2 and os.system(f"chattr +a {root / 'd'} 2>/dev/null"):
            pytest.skip(f"{tmp_path} does not support append-only directories")

    conn = sqlite3.connect(tmp_path / "audit.db", isolation_level=None)
    pol = policy(roots=[str(root)], max_delete=False, **AGE)
    try:
        report = runner(tmp_path, DAY, hook=hook, audit=AuditLog(conn)).run(pol)
    finally:
        os.system(f"chattr -a {root / 'd'}")
    assert report.files == 0 and report.skipped == {"permission": 3}
    assert conn.execute("SELECT COUNT(*) FROM cleanup_audit").fetchone() == (0,)
    left = names(root / "d")
    assert len(left) == 3 and sum(n.startswith(quarantine.PREFIX) for n in left) == 1
    again = runner(tmp_path, DAY, audit=AuditLog(conn)).run(pol)
    assert again.files == 3 and names(root) == {"d"}
    assert conn.execute("SELECT COUNT(*) FROM cleanup_audit").fetchone() == (3,)
