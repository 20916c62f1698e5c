"""A loop image whose path is hidden by permissions holds only the roots it can really be under.

A cleanup without root cannot open /dev/loopN nor look into a root-only directory, so it cannot tell
which file backs a loop device whose image lies there. Yet the path is here: the image is one file
of one filesystem, under a root only when its place in that filesystem (mountinfo's `root` field and
mount point: a bind mount shows a directory at another path) is at or below the root's. Made real: a
tmpfs holding `outer/secret/data.img` (secret 0700, root's) attached to a loop device, the run as
uid 65533 in a PID namespace of its own (tests/test_cleanup_uninspected.py). The expected answer of
each root is written by hand from where it is, not computed by the code under test."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trainguard.actions.cleanup.safety.fsplace import Place, place_in, root_place
from trainguard.records import Mount, MountKind

from tests.support.mounts import root_reason
from tests.test_cleanup_inuse import attached, mounted
from tests.test_cleanup_uninspected import RUNNER, _cleanup_as_runner, _reason

pytestmark = [pytest.mark.timeout(120)]

OLD = time.time() - 30 * 86400
# root (relative to the test's base) -> whether the image can be below it (then its old file stays)
ROOTS = {
    "fs/outer": True,  # holds secret/, the image's directory
    "view": True,  # a bind mount of fs/outer: the image is at view/secret/data.img
    "fs/elsewhere": False,  # the same filesystem, another directory
    "fs/outer/sub": False,  # beside secret/, below the directory that holds it
    "view-elsewhere": False,  # a bind mount of fs/elsewhere
}


def _runner_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, RUNNER, RUNNER)
    return path


@pytest.fixture
def hidden_image():
    """(base, loop device): base/fs a tmpfs with the image attached in a 0700 directory of root's, and
    base/view, base/view-elsewhere bind mounts of two of its directories; an old file in each root."""
    if reason := (_reason() or root_reason(need_loop=True)):
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="tg-hidden-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        with contextlib.ExitStack() as stack:
            fs = stack.enter_context(mounted("tg-test-tmpfs", base / "fs", "-t", "tmpfs", "-o", "size=16m,mode=0755"))
            for rel in ("fs/outer/sub", "fs/elsewhere", "state"):
                _runner_dir(base / rel)
            os.chown(fs / "outer", RUNNER, RUNNER)
            secret = fs / "outer" / "secret"
            secret.mkdir(mode=0o700)
            with open(secret / "data.img", "wb") as fh:
                fh.truncate(1 << 20)
            device = stack.enter_context(attached(secret / "data.img"))
            stack.enter_context(mounted(str(fs / "outer"), base / "view", "--bind"))
            stack.enter_context(mounted(str(fs / "elsewhere"), base / "view-elsewhere", "--bind"))
            yield base, device
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _config(base: Path, root: Path) -> None:
    (base / "config.toml").write_text(
        f'[[cleanup]]\nname = "old"\ntype = "age"\nroots = ["{root}"]\nolder_than = "7d"\n'
        'age_by = ["mtime"]\ngrace = "0s"\nmax_delete = false\nremove_empty_dirs = false\n')


@pytest.mark.root
@pytest.mark.parametrize("rel", sorted(ROOTS))
def test_a_run_without_root_keeps_only_the_roots_the_hidden_image_can_be_under(hidden_image, rel):
    base, device = hidden_image
    root = base / rel
    old = root / "old.log"
    old.write_bytes(b"x" * 4096)
    os.chown(old, RUNNER, RUNNER)
    os.utime(old, (OLD, OLD))
    _config(base, root)
    done = _cleanup_as_runner(base, holder=False)
    assert done.returncode == 0, done.stdout + done.stderr
    if ROOTS[rel]:
        assert old.exists(), done.stdout
        assert device in done.stdout + done.stderr, done.stdout + done.stderr  # says which loop device
    else:
        assert not old.exists(), done.stdout + done.stderr
    assert (base / "fs" / "outer" / "secret" / "data.img").exists()
    backing = Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file").read_text().strip()
    assert backing == str(base / "fs" / "outer" / "secret" / "data.img")  # still attached, by that path


@pytest.mark.root
def test_a_hidden_path_on_a_mount_point_it_cannot_see_keeps_every_root(hidden_image):
    """A mount point below the directory that cannot be looked into: the path's text says the mount, yet
    the run cannot check it reaches that mount there, so every root stays (fail closed)."""
    base, _device = hidden_image
    inner = base / "fs" / "outer" / "secret" / "inner"
    with contextlib.ExitStack() as stack:
        stack.enter_context(mounted("tg-test-tmpfs", inner, "-t", "tmpfs", "-o", "size=4m,mode=0755"))
        with open(inner / "inner.img", "wb") as fh:
            fh.truncate(1 << 20)
        device = stack.enter_context(attached(inner / "inner.img"))
        root = base / "fs" / "elsewhere"
        old = root / "old.log"
        old.write_bytes(b"x")
        os.chown(old, RUNNER, RUNNER)
        os.utime(old, (OLD, OLD))
        _config(base, root)
        done = _cleanup_as_runner(base, holder=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert old.exists(), done.stdout
        assert device in done.stdout + done.stderr


# --- the rule at the boundary, against a plain method: path components, compared one by one ----------

_names = st.sampled_from(["a", "b", "ab", "a.b", "b-"])
_paths = st.lists(_names, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(root=_paths, image=_paths, same_fs=st.booleans())
def test_a_place_holds_exactly_what_is_at_or_below_it(root, image, same_fs):
    """`/a/ab` is not below `/a/a`, `/` holds everything, another filesystem holds nothing."""
    plain = same_fs and [p for p in image.split("/") if p][:len([p for p in root.split("/") if p])] == \
        [p for p in root.split("/") if p]
    assert Place(7, root).holds(Place(7 if same_fs else 8, image)) == plain


def test_a_bind_mount_is_placed_by_the_directory_it_shows():
    tmpfs = dict(fstype="tmpfs", source="t", major=0, minor=50, kind=MountKind.LOCAL)
    bind = Mount(mount_point="/srv/view", root="/outer", mount_id=3, **tmpfs)
    assert place_in(bind, "/srv/view/secret/data.img") == Place(os.makedev(0, 50), "/outer/secret/data.img")
    assert place_in(bind, "/srv/view") == Place(os.makedev(0, 50), "/outer")
    assert place_in(Mount(mount_point="/", root="/", mount_id=1, **tmpfs), "/x") == Place(os.makedev(0, 50), "/x")
    gone = Mount(mount_point="/srv/old", root="/outer//deleted", mount_id=4, **tmpfs)
    assert place_in(gone, "/srv/old/a") is None  # its directory was deleted: where it is cannot be said
    assert root_place("/srv/view/sub", 3, [bind]) == Place(os.makedev(0, 50), "/outer/sub")
    assert root_place("/srv/view/sub", 9, [bind]) is None  # its mount is not in the table read: keep it
    assert root_place("/srv/view/sub", None, [bind]) is None
