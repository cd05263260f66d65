"""Configuration precedence: flags > TRIMTAB_* environment > trimtab.toml > defaults, and typos are errors."""

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.config import ConfigError, build_default_map


def test_toml_top_level_and_sections():
    commands = {"agent": {"db_url", "interval"}, "check": {"db_url", "window"}}
    dm = build_default_map({"db_url": "sqlite:///a", "agent": {"interval": 2}, "check": {"window": 5}}, commands, "t.toml")
    assert dm == {"agent": {"db_url": "sqlite:///a", "interval": 2}, "check": {"db_url": "sqlite:///a", "window": 5}}


def test_unknown_keys_are_errors_naming_the_key():
    with pytest.raises(ConfigError, match="intervall"):
        build_default_map({"agent": {"intervall": 2}}, {"agent": {"interval"}}, "t.toml")
    with pytest.raises(ConfigError, match="nope"):
        build_default_map({"nope": 1}, {"agent": {"interval"}}, "t.toml")


def _window_used(tmp_path, env, *args):
    """Ask check for a node that has no data: the error message echoes the window that was in force."""
    res = CliRunner(env=env).invoke(cli, [*args, "check", "--db", f"sqlite:///{tmp_path}/none.db"])
    return res


def test_precedence_flag_over_env_over_file(tmp_path):
    cfg = tmp_path / "trimtab.toml"
    cfg.write_text('[check]\nwindow = 11\nnode = "from-file"\n')
    db = f"sqlite:///{tmp_path}/t.db"
    assert CliRunner().invoke(cli, ["agent", "--db", db, "--simulate", "1", "--interval", "0.1", "--duration", "0.2",
                                    "--spool-dir", str(tmp_path / "s")]).exit_code == 0
    base = ["--config", str(cfg), "check", "--db", db]
    r = CliRunner().invoke(cli, base)
    assert "node 'from-file' in the last 11 s" in r.stderr
    r = CliRunner(env={"TRIMTAB_WINDOW": "22"}).invoke(cli, base)
    assert "in the last 22 s" in r.stderr
    r = CliRunner(env={"TRIMTAB_WINDOW": "22"}).invoke(cli, base + ["--window", "33"])
    assert "in the last 33 s" in r.stderr


def test_a_broken_config_file_is_a_usage_error_with_the_line(tmp_path):
    cfg = tmp_path / "trimtab.toml"
    cfg.write_text("[agent]\ninterval = = 2\n")
    r = CliRunner().invoke(cli, ["--config", str(cfg), "check"])
    assert r.exit_code == 2 and "line 2" in r.output
