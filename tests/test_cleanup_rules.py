"""The age rules are written twice, in C (_agescan.c) and in Python (agerules.py): on random trees
(files, symlinks, fifos, directories, hard links, odd names), random times on both sides of every
boundary, random policies, open files and bounds, both judges decide the same, entry by entry,
and leave the same tree behind."""

from __future__ import annotations

import math
import os
import shutil
import stat
import tempfile
import time
from array import array

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from trainguard.actions.cleanup.engine import agerules
from trainguard.actions.cleanup.engine.agerules import Bound, Rule

pytestmark = pytest.mark.skipif(agerules._agescan is None, reason="trainguard.actions.cleanup.engine._agescan is not built")

DAY = 86400.0
T0 = math.floor(time.time())
KINDS = ("file", "empty", "symlink", "dangling", "fifo", "dir", "hardlink")
NAMES = st.text(st.sampled_from("abc.-_ \n\u00e9"), min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))
# Times: whole days, odd nanoseconds, and exactly on the policy's boundaries (older_than, grace).
OFFSETS = st.one_of(st.integers(-40, 3).map(lambda d: d * DAY), st.floats(-40 * DAY, 2 * DAY),
                    st.sampled_from(["boundary", "grace"]))

ENTRY = st.tuples(NAMES, st.sampled_from(KINDS), OFFSETS, OFFSETS, st.integers(0, 3), st.booleans(), st.booleans())


def _time(offset, now: float, older_than: float, changed_after: float) -> float:
    if offset == "boundary":
        return now - older_than  # due exactly now
    if offset == "grace":
        return changed_after
    return T0 + offset


def build(root: str, entries, now: float, older_than: float, changed_after: float) -> list[str]:
    """The tree in one directory; the names, in creation order (the batch)."""
    os.mkdir(root)
    made = []
    for name, kind, atime, mtime, blocks, _open, _wanted in entries:
        path = os.path.join(root, name)
        if name in made:
            continue
        if kind in ("file", "empty"):
            with open(path, "wb") as fh:
                fh.write(b"x" * 4096 * blocks if kind == "file" else b"")
        elif kind == "symlink":
            os.symlink(made[0] if made else "/etc/hostname", path)
        elif kind == "dangling":
            os.symlink("nowhere", path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            os.mkdir(path)
        elif kind == "hardlink":
            # lstat only: following an earlier symlink would read it and bump its atime.
            target = next((os.path.join(root, m) for m in made
                           if stat.S_ISREG(os.lstat(os.path.join(root, m)).st_mode)), None)
            if target is None:
                continue
            os.link(target, path)
        times = (_time(atime, now, older_than, changed_after), _time(mtime, now, older_than, changed_after))
        os.utime(path, ns=tuple(int(t * 1e9) for t in times), follow_symlinks=False)
        made.append(name)
    return made


def judge(root: str, names, entries, rule: Rule, delete: bool, bound: Bound, listed: bool, compiled: bool):
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        by_name = {e[0]: e for e in reversed(entries)}
        inos = sorted({os.lstat(os.path.join(root, n)).st_ino for n in names if by_name[n][5]})
        wanted = bytes(by_name[n][6] for n in names)
        got = agerules.judge_batch(fd, list(names), wanted, rule._replace(dev=os.fstat(fd).st_dev),
                                   array("Q", inos).tobytes(), delete, bound, listed, compiled)
    finally:
        os.close(fd)
    # Inodes differ between two copies of a tree: compare by name.
    return (sorted(got.gone), sorted(n for n, _i in got.dirs), sorted((n, c, e, b) for n, c, e, _i, b in got.issues),
            got.files, got.bytes, got.young, got.grace, sorted(os.listdir(root)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(ENTRY, min_size=1, max_size=14), mask=st.integers(0, 7), older_days=st.integers(0, 30),
       now_days=st.integers(0, 3), grace_s=st.sampled_from([0.0, 1.0, 600.0, 2 * DAY]), delete=st.booleans(),
       listed=st.booleans(), bound=st.tuples(st.integers(-1, 6), st.sampled_from([-1, 0, 4096, 20000]),
                                             st.sampled_from([-1, 0, 4096, 10000])))
# Once building the tree followed the symlink (to find a hard link's target) and bumped its atime: the copies
# differed, not the judges.
@example(entries=[("-", "symlink", 0, 0, 0, False, True), (" ", "file", 0, 0, 0, False, False),
                  ("_", "hardlink", 0, 0, 0, False, False)], mask=1, older_days=0, now_days=0, grace_s=0.0,
         delete=False, listed=True, bound=(0, -1, -1))
def test_the_compiled_and_the_python_judge_decide_alike(entries, mask, older_days, now_days, grace_s, delete,
                                                         listed, bound):
    now = T0 + now_days * DAY + DAY / 2  # ctimes (creation, about T0) are never on a boundary
    older_than = older_days * DAY
    rule = Rule(0, mask, now, older_than, now - grace_s)
    base = tempfile.mkdtemp(prefix="tg-rules-")
    try:
        results = []
        for compiled in (True, False):
            root = os.path.join(base, "c" if compiled else "p")
            names = build(root, entries, now, older_than, now - grace_s)
            results.append(judge(root, names, entries, rule, delete, Bound(*bound), listed, compiled))
        (c_gone, *c_rest), (p_gone, *p_rest) = results
        assert c_rest == p_rest
        # An age by ctime is the copy's creation time, which no test can set: the two trees' differ by
        # the time it took to build one. Every other field is exact.
        assert [(n, b) for n, b, _a in c_gone] == [(n, b) for n, b, _a in p_gone]
        assert all(abs(a - b) < 1.0 if mask & 4 else a == b for (_n, _s, a), (_m, _t, b) in zip(c_gone, p_gone))
    finally:
        shutil.rmtree(base)


def test_the_boundaries_are_exact(tmp_path):
    """Due at exactly older_than; in grace only when changed strictly after now - grace."""
    now = T0 + DAY / 2
    entries = [("due", "file", "boundary", "boundary", 1, False, True),
               ("young", "file", 0.0, now - T0 - DAY + 1e-3, 1, False, True)]
    names = build(str(tmp_path / "t"), entries, now, DAY, now - 3 * DAY)
    for compiled in (True, False):
        got = judge(str(tmp_path / "t"), names, entries, Rule(0, 2, now, DAY, now - 60), False, Bound(), True, compiled)
        assert [g[0] for g in got[0]] == ["due"] and got[5] == 1


@pytest.mark.parametrize("delete", [False, True])
def test_a_large_count_split_over_threads_decides_as_one_thread_does(tmp_path, delete):
    """A count of many names is judged on several threads (deleting never is): the result is the
    same, entry by entry and in order, as one thread's and as the Python judge's."""
    now = T0 + DAY / 2
    kinds = ("file", "file", "empty", "symlink", "dir", "fifo", "hardlink")
    entries = [(f"n{i:04d}", kinds[i % len(kinds)], -(i % 40) * DAY, -(i % 37) * DAY + 17.5, i % 3, i % 11 == 0,
                i % 13 != 0) for i in range(1500)]
    rule, bound = Rule(0, 2, now, 10 * DAY, now - 60), Bound(400, -1, -1)
    results = {}
    for how in ("threads", "one", "python"):
        root = str(tmp_path / how)
        names = build(root, entries, now, rule.older_than, rule.changed_after)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            by_name = {e[0]: e for e in entries}
            inos = array("Q", sorted(os.lstat(os.path.join(root, n)).st_ino for n in names if by_name[n][5]))
            wanted = bytes(by_name[n][6] for n in names)
            r = rule._replace(dev=os.fstat(fd).st_dev)
            if how == "python":
                got = agerules.judge_batch(fd, names, wanted, r, inos.tobytes(), delete, bound, True, False)
            else:
                got = agerules.Batch(*agerules._agescan.age_batch(fd, names, wanted, *r, inos.tobytes(), delete,
                                                                  *bound, True, 4 if how == "threads" else 1))
        finally:
            os.close(fd)
        results[how] = ([g[:2] for g in got.gone], [d[0] for d in got.dirs], [i[:3] + i[4:] for i in got.issues],
                        got.files, got.bytes, got.young, got.grace, sorted(os.listdir(root)))
    assert results["threads"] == results["one"] == results["python"]
    files, young = results["one"][3], results["one"][5]
    assert young > 0 and (files == 400 if delete else files > 400)  # the bound stopped the deletion, not the count
