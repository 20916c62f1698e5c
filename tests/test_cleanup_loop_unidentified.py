"""A loop device whose backing file cannot be identified keeps everything it could be (fail closed).

In a container the daemon often has no /dev/loopN, and the host's path of the image is not where the
container sees it. Here that is made real: an ext4 image on a tmpfs is attached and mounted, the tmpfs is
then seen only through a bind mount (its first mount point lazily unmounted, so sysfs names the image
by a path that is not there), and the open-file index is given a /dev without the loop devices.
Without the driver's answer the image could be any file: every root stays, with one warning naming the
loop device. With /dev (the driver answers), only the image stays: the rule is not broader than that.
Real loop devices and mounts, as root."""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from trainguard.actions.cleanup.runner import CleanupRunner
from trainguard.actions.cleanup.safety.inuse import OpenFiles

from tests.support.mounts import root_reason
from tests.test_cleanup import DAY, make, policy
from tests.test_cleanup_inuse import _sh, aged, attached, ext4_image, mounted

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]


@pytest.fixture
def hidden_image(tmp_path):
    """(root to clean, the image below it, its loop device): the image attached and mounted, its
    filesystem seen at `seen` only, sysfs naming it by a path that does not exist here."""
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    first, seen = tmp_path / "first", tmp_path / "seen"
    with contextlib.ExitStack() as stack:
        stack.enter_context(mounted("tg-test-tmpfs", first, "-t", "tmpfs", "-o", "size=64m"))
        image = ext4_image(first / "scratch" / "data.img")
        device = stack.enter_context(attached(image))
        stack.enter_context(mounted(device, tmp_path / "mnt"))
        stack.enter_context(mounted(str(first), seen, "--bind"))
        _sh("umount", "-l", str(first))
        backing = Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file").read_text().strip()
        assert not os.path.exists(backing), backing  # sysfs names a path that is not there
        root = seen / "scratch"
        yield root, aged(root / "data.img"), device
        subprocess.run(["umount", str(tmp_path / "mnt")], capture_output=True, timeout=60)


def run(tmp_path: Path, root: Path, open_files: OpenFiles, **kw):
    pol = policy(roots=[str(root)], **{"type": "age", "age_by": ["mtime"], "older_than": "7d", "grace": "0s", **kw})
    return CleanupRunner([pol], homes=frozenset(), open_files=open_files).run(pol)


def no_loop_devices(tmp_path: Path) -> str:
    """A /dev as a container's: no loop devices in it."""
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    return str(dev)


@pytest.mark.parametrize("max_delete", [False, 10000], ids=["one-pass", "guarded"])
def test_without_the_loop_device_every_root_it_could_be_in_stays(tmp_path, hidden_image, caplog, max_delete):
    root, image, device = hidden_image
    old = make(root / "old.log")
    open_files = OpenFiles(dev_root=no_loop_devices(tmp_path))  # the daemon's, kept from run to run
    with caplog.at_level(logging.WARNING):
        first = run(tmp_path, root, open_files, max_delete=max_delete)
        again = run(tmp_path, root, open_files, max_delete=max_delete)
    assert image.exists() and old.exists(), first
    assert first.files == again.files == 0
    assert device in first.roots[0].note, first.roots[0].note
    told = [r.getMessage() for r in caplog.records if device in r.getMessage() and "cannot tell" in r.getMessage()]
    assert len(told) == 1, told  # once per loop device, not once per run


def test_with_the_loop_device_only_the_image_stays(tmp_path, hidden_image):
    root, image, device = hidden_image
    old = make(root / "old.log")
    report = run(tmp_path, root, OpenFiles())
    assert image.exists() and not old.exists(), report
    assert report.in_use and device in report.in_use[0]


def test_a_checkpoint_named_image_behind_a_loop_stays_without_the_loop_device(tmp_path, hidden_image):
    root, image, _device = hidden_image
    ckpt = root / "run"
    ckpt.mkdir()
    os.rename(image, ckpt / "step_100.ckpt")  # the image itself, under a checkpoint's name
    for step in (200, 300):
        make(ckpt / f"step_{step}.ckpt", age=DAY * (5 - step / 100))
    os.utime(ckpt / "step_100.ckpt", (1, 1))
    pol = policy(type="checkpoints", roots=[str(root)], keep_last=1, grace="0s")
    report = CleanupRunner([pol], homes=frozenset(), open_files=OpenFiles(dev_root=no_loop_devices(tmp_path))).run(pol)
    assert (ckpt / "step_100.ckpt").exists() and (ckpt / "step_200.ckpt").exists(), report
    assert report.files == 0


@pytest.mark.parametrize("node", ["another-loop", "not-a-loop"])
def test_a_dev_whose_loop_node_is_another_device_is_not_believed(tmp_path, hidden_image, node):
    """A container's /dev/loopN can be another device's node: an unattached loop answers ENXIO (read
    as "detached"), a character device refuses the ioctl. Neither may stand for the real loop."""
    root, image, device = hidden_image
    dev = tmp_path / "dev"
    dev.mkdir()
    if node == "another-loop":
        free = _sh("losetup", "--find")  # a loop device nothing is attached to
        os.mknod(dev / os.path.basename(device), 0o600 | stat.S_IFBLK, os.stat(free).st_rdev)
    else:
        os.mknod(dev / os.path.basename(device), 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    report = run(tmp_path, root, OpenFiles(dev_root=str(dev)))
    assert image.exists(), report
    assert device in report.roots[0].note


def test_the_size_rule_matches_the_loop_drivers_own_view(tmp_path):
    """Without the driver, a file at the named path is believed only when it has the loop's size: the
    rule, from sysfs, against real loop devices with an offset and a size limit; the expected answers
    worked out by hand (a loop maps the file from its offset, to sizelimit, in whole sectors)."""
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    from trainguard.actions.cleanup.safety.kernel_holders import _loop_size_fits

    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(20 << 20)
    m = 1 << 20
    sizes = [20 * m, 20 * m - 512, 20 * m + 512, 8 * m, 8 * m + 4096]
    cases = {(): [True, False, False, False, False],
             ("-o", "4096"): [True, False, False, False, False],
             ("-o", "4096", "--sizelimit", str(8 * m)): [True, True, True, False, True]}
    for args, expected in cases.items():
        device = _sh("losetup", "--find", "--show", *args, str(image))
        try:
            got = [_loop_size_fits("/sys", os.path.basename(device), n) for n in sizes]
        finally:
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60)
        assert got == expected, (args, got)


HIDDEN = """
import os, sys
sys.path.insert(0, sys.argv[1])
from trainguard.actions.cleanup.safety.kernel_holders import ANYWHERE, KernelHolders
holders = KernelHolders()
os.setgroups([]); os.setgid(65533); os.setuid(65533)  # a daemon without root: the image's directory is closed to it
_held, unknown = holders.read()
print(repr(({"anywhere" if dev == ANYWHERE else dev: what for dev, what in unknown.by_dev.items()},
            [(place.dev, place.path, what) for place, what in unknown.hidden])))
"""


def test_a_path_hidden_by_permissions_is_placed_in_its_filesystem():
    """Without root, /dev/loopN cannot be opened and a root-only directory cannot be looked into, yet the
    path is here: the image is placed in its filesystem (its device, its path from that filesystem's top),
    not held anywhere; which roots that place is under: tests/test_cleanup_loop_hidden.py."""
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="tg-hidden-", dir="/tmp"))  # reachable by uid 65533, unlike tmp_path
    os.chmod(base, 0o755)
    fs = base / "fs"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        stack.enter_context(mounted("tg-test-tmpfs", fs, "-t", "tmpfs", "-o", "size=64m,mode=0700"))
        image = ext4_image(fs / "secret" / "data.img")
        device = stack.enter_context(attached(image))
        daemon = str(Path(__file__).resolve().parents[1] / "daemon")
        out = subprocess.run([sys.executable, "-c", HIDDEN, daemon], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        by_dev, hidden = ast.literal_eval(out.stdout.strip())
        assert not [what for what in by_dev.values() if device + " " in what], by_dev
        mine = [(dev, path) for dev, path, what in hidden if device + " " in what]
        assert mine == [(os.stat(fs).st_dev, "/secret/data.img")], hidden
