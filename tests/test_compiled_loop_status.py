"""`trainguard status` and `check-config` say whether cleanup runs the compiled loop: from this
checkout (after `python3 setup.py build_ext --inplace`) and from a copy of the package without it."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.cli import DAEMON_SRC, cli_env, trainguard
from trainguard.actions.cleanup.engine import agepass

NOT_BUILT = "cleanup: compiled loop not built, Python loop in use (install a C compiler and reinstall)"


def _config(tmp_path):
    path = tmp_path / "trainguard.toml"
    path.write_text(f'[filesystems]\nexclude = ["*"]\npaths = [{str(tmp_path)!r}]\n')
    return path


@pytest.fixture
def without_loop(tmp_path):
    """This checkout's package, less any compiled module: an install without a C compiler."""
    copy = tmp_path / "pkg"
    shutil.copytree(DAEMON_SRC, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return cli_env(PYTHONPATH=str(copy))


def test_check_config_says_the_compiled_loop_is_active_when_built(tmp_path):
    if not agepass.ENABLED:
        pytest.skip("the compiled loop is not built in this checkout (python3 setup.py build_ext --inplace)")
    path = _config(tmp_path)
    text = trainguard("check-config", str(path))
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[2] == "# cleanup: compiled loop active"
    doc = json.loads(trainguard("check-config", "--json", str(path)).stdout)
    assert doc["cleanup_loop"] == {"compiled": True, "message": "cleanup: compiled loop active", "error": None}


def test_check_config_and_status_say_when_the_python_loop_is_in_use(tmp_path, without_loop):
    path = _config(tmp_path)
    text = trainguard("check-config", str(path), env=without_loop)
    assert text.returncode == 0, text.stderr
    assert f"# {NOT_BUILT}" in text.stdout.splitlines()
    doc = json.loads(trainguard("check-config", "--json", str(path), env=without_loop).stdout)
    assert doc["cleanup_loop"]["compiled"] is False
    state = ["--config", str(path), "--state-dir", str(tmp_path / "s")]
    status = json.loads(trainguard("status", "--json", *state, env=without_loop).stdout)
    assert status["cleanup_loop"] == {"compiled": False, "message": NOT_BUILT, "error": None}
    table = trainguard("status", *state, env=without_loop)
    assert table.returncode == 0, table.stderr
    assert NOT_BUILT in table.stdout.splitlines()
    zh = trainguard("status", *state, env={**without_loop, "TRAINGUARD_NOTIFY__LANGUAGE": "zh"})
    assert "清理：编译循环未构建，正在使用 Python 循环（安装 C 编译器后重新安装）" in zh.stdout, zh.stdout + zh.stderr


def test_status_says_the_compiled_loop_is_active_when_built(tmp_path):
    if not agepass.ENABLED:
        pytest.skip("the compiled loop is not built in this checkout (python3 setup.py build_ext --inplace)")
    state = ["--config", str(_config(tmp_path)), "--state-dir", str(tmp_path / "s")]
    doc = json.loads(trainguard("status", "--json", *state).stdout)
    assert doc["cleanup_loop"]["compiled"] is True
    assert "cleanup: compiled loop active" in trainguard("status", *state).stdout.splitlines()
