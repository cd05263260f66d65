"""`trimtab verl-tail` passes its arguments to the verl adapter unchanged."""

from click.testing import CliRunner

from trimtab.cli.main import cli


def test_verl_tail_shows_the_adapters_options():
    res = CliRunner().invoke(cli, ["verl-tail", "--help"])
    assert res.exit_code == 0
    assert "--job" in res.output and "--server" in res.output and "path" in res.output


def test_verl_tail_without_arguments_is_a_usage_error():
    res = CliRunner().invoke(cli, ["verl-tail"])
    assert res.exit_code == 2
    assert "--job" in res.output
