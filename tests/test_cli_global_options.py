"""Global options given before the subcommand reach it (docs/reference.md: `trainguard --config PATH status`)."""

from __future__ import annotations

from trainguard import cli


def _config(tmp_path):
    path = tmp_path / "tg.toml"
    path.write_text(f'[filesystems]\npaths = ["{tmp_path}"]\nexclude = ["*"]\n[metrics]\nlisten = ""\n')
    return path


def test_config_before_the_subcommand_is_used(tmp_path, capsys):
    path = _config(tmp_path)
    assert cli.main(["--config", str(path), "check-config"]) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith(f"# valid: {path}\n")


def test_state_dir_before_the_subcommand_is_used(tmp_path, capsys):
    path, state = _config(tmp_path), tmp_path / "state"
    cli.main(["--config", str(path), "--state-dir", str(state), "run", "--once"])
    assert (state / "state.db").exists()


def test_option_after_the_subcommand_wins(tmp_path, capsys):
    path = _config(tmp_path)
    assert cli.main(["--config", str(tmp_path / "missing.toml"), "check-config", "--config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"# valid: {path}\n")
