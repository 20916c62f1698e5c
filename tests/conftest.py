"""Shared fixtures. Mount and FUSE fixtures skip with the reason naming what is missing.

Sizes and options can be chosen per test with indirect parametrization, e.g.
``@pytest.mark.parametrize("tmpfs_mount", [64 * 2**20], indirect=True)`` or
``@pytest.mark.parametrize("slowfs", [{"name": "juicefs"}], indirect=True)``.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

from tests.support.http_receiver import HttpReceiver
from tests.support.mounts import loop_ext4, root_reason, tmpfs
from tests.support.slowfs import SlowFs, fuse_available

# `.venv/bin/python -m pytest` without activating the venv: its commands (trainguard, hadolint,
# check-jsonschema) are found as if it were active.
if sys.prefix != sys.base_prefix:
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

# Property tests run the same examples on every run (CI included): a failure is reproducible, never luck.
# HYPOTHESIS_PROFILE=explore searches anew (random examples, the local example database).
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture
def tmpfs_mount(request):
    """A fresh tmpfs (16 MiB unless parametrized with a byte size); yields its Path."""
    if reason := root_reason():
        pytest.skip(reason)
    with tmpfs(getattr(request, "param", 16 * 2**20)) as mountpoint:
        yield mountpoint


@pytest.fixture
def ext4_mount(request):
    """A fresh loop-mounted ext4 (32 MiB unless parametrized with a byte size); yields its Path."""
    if reason := root_reason(need_loop=True):
        pytest.skip(reason)
    with loop_ext4(getattr(request, "param", 32 * 2**20)) as mountpoint:
        yield mountpoint


@pytest.fixture
def slowfs(request, tmp_path):
    """A mounted SlowFs on ``tmp_path/"mnt"``; parametrize with a dict of SlowFs keyword arguments."""
    if reason := fuse_available():
        pytest.skip(reason)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with SlowFs(mountpoint, **getattr(request, "param", {})) as fs:
        yield fs


@pytest.fixture
def http_receiver():
    """A started HttpReceiver on 127.0.0.1; stopped at teardown."""
    with HttpReceiver() as receiver:
        yield receiver
