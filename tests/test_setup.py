"""The README's set-up and test commands are what CI runs, and one copy of trainguard is under test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trainguard

from tests.support.cli import cli_env

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "daemon" / "trainguard"
# The copies of the package on sys.path, as a child process started the way the tests start them sees it.
COPIES = ("import sys, os\n"
          "print(sorted({os.path.realpath(os.path.join(p or '.', 'trainguard'))\n"
          "              for p in sys.path if os.path.isfile(os.path.join(p or '.', 'trainguard', '__init__.py'))}))\n"
          "import trainguard; print(os.path.realpath(trainguard.__file__))")


def _set_up_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_ci_runs_the_readme_set_up_and_test_commands_verbatim():
    blocks = _set_up_blocks()
    assert len(blocks) == 2, "the Set up section has the run command, then the test command"
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    for block in blocks:
        assert block in ci_lines, f".ci/run does not run the README's line {block!r}"
    assert [line for line in ci_lines if line.startswith("scripts/setup-venv")] == blocks


def test_one_copy_of_the_package_is_under_test():
    assert Path(trainguard.__file__).resolve() == SOURCE / "__init__.py"
    here = {os.path.realpath(Path(p or ".") / "trainguard") for p in sys.path
            if (Path(p or ".") / "trainguard" / "__init__.py").is_file()}
    assert here == {str(SOURCE)}, f"more than one trainguard importable: {sorted(here)}"
    child = subprocess.run([sys.executable, "-c", COPIES], env=cli_env(), capture_output=True, text=True,
                           timeout=60, check=True)
    assert child.stdout.splitlines() == [str([str(SOURCE)]), str(SOURCE / "__init__.py")]


def test_set_up_without_venv_support_names_the_package_to_install():
    """As a user on a Debian or Ubuntu without python3-venv: it says what to install and leaves no venv."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the script as another user")
    where = Path(tempfile.mkdtemp(prefix="setup-venv-"))  # in /tmp, where the other user can write
    where.chmod(0o777)
    venv = where / "venv"
    env = {"PATH": os.environ["PATH"], "VENV_DIR": str(venv), "VENV_PYTHON": "/bin/false"}
    try:
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              str(REPO / "scripts" / "setup-venv")], env=env, capture_output=True, text=True,
                             timeout=60)
        left = venv.exists()
    finally:
        shutil.rmtree(where)
    assert out.returncode == 1, out.stderr
    assert "sudo apt-get install python3-venv" in out.stderr and not left
