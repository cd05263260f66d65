"""Every reader of a token file — `trimtab agent --token-file`, `trimtab verl-tail --token-file` (or
TRIMTAB_TOKEN_FILE), the verl plugin's ``+trimtab.token_file`` — refuses one that cannot be a token in the same one
line, naming the file and what is wrong, without a traceback: the commands exit 78 (waiting cannot fix it), the
verl plugin says it once and leaves the training run alone."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.paths import EXIT_MISCONFIGURED
from trimtab.paths import BadToken, token_from
from trimtab.trainer.adapters import verl_plugin

BAD_FILES = [
    pytest.param((b"tt_abc\ntt_def\n", "holds 2 lines"), id="two-lines"),
    pytest.param((b"\x89PNG\r\n\x1a\n\x00\x00\xff", "binary or non-ASCII bytes"), id="binary"),
    pytest.param((b"\n", "is empty"), id="empty"),
    pytest.param((None, "cannot read the token file"), id="missing"),
]


@pytest.fixture
def bad_file(request, tmp_path):
    content, words = request.param
    path = tmp_path / "job.token"
    if content is not None:
        path.write_bytes(content)
    return path, words


def the_one_message(path) -> str:
    """What the shared check says about this file (every reader must say exactly this)."""
    with pytest.raises(BadToken) as caught:
        token_from(None, path)
    return str(caught.value)


def refused_in_one_line(res, path, words) -> None:
    assert res.exit_code == EXIT_MISCONFIGURED, res.output
    assert the_one_message(path) in res.output and str(path) in res.output and words in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), "no traceback"


@pytest.mark.parametrize("bad_file", BAD_FILES, indirect=True)
def test_the_agent_refuses_a_token_file_that_is_not_one_token_before_sampling(bad_file, tmp_path):
    path, words = bad_file
    res = CliRunner().invoke(cli, ["agent", "--simulate", "1", "--server", "http://127.0.0.1:9", "--token-file",
                                   str(path), "--state-dir", str(tmp_path / "state")])
    refused_in_one_line(res, path, words)


@pytest.mark.parametrize("bad_file", BAD_FILES, indirect=True)
def test_verl_tail_refuses_a_token_file_that_is_not_one_token_before_tailing(bad_file, tmp_path):
    path, words = bad_file
    log = tmp_path / "verl.jsonl"
    res = CliRunner().invoke(cli, ["verl-tail", str(log), "--job", "j", "--server", "http://127.0.0.1:9",
                                   "--token-file", str(path)])
    refused_in_one_line(res, path, words)


def test_verl_tail_reads_trimtab_token_file_from_the_environment_the_same_way(tmp_path):
    path = tmp_path / "job.token"
    path.write_bytes(b"tt_abc\ntt_def\n")
    res = CliRunner().invoke(cli, ["verl-tail", str(tmp_path / "verl.jsonl"), "--job", "j", "--server",
                                   "http://127.0.0.1:9"], env={"TRIMTAB_TOKEN_FILE": str(path)})
    refused_in_one_line(res, path, "holds 2 lines")


def test_verl_tail_refuses_a_token_of_two_lines_given_outright():
    res = CliRunner().invoke(cli, ["verl-tail", "x.jsonl", "--job", "j", "--server", "http://127.0.0.1:9",
                                   "--token", "tt_abc\ntt_def"])
    assert res.exit_code == EXIT_MISCONFIGURED, res.output
    assert "--token (or TRIMTAB_TOKEN) holds 2 lines" in res.output


@pytest.mark.parametrize("bad_file", BAD_FILES, indirect=True)
def test_the_verl_plugin_says_once_what_is_wrong_with_its_token_file_and_stays_detached(bad_file, caplog,
                                                                                       monkeypatch):
    for var in ("TRIMTAB_SERVER", "TRIMTAB_TOKEN", "TRIMTAB_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    path, words = bad_file
    trainer = SimpleNamespace(config={"trimtab": {"server": "http://127.0.0.1:9", "token_file": str(path)},
                                      "trainer": {"experiment_name": "grpo"}})
    with caplog.at_level(logging.WARNING, logger="trimtab.trainer"):
        session = verl_plugin._start(trainer, "v1")
    assert session is None  # fit() runs as if trimtab were not installed
    (record,) = [r for r in caplog.records if r.name == "trimtab.trainer"]
    assert record.exc_info is None, "no traceback"
    message = record.getMessage()
    assert the_one_message(path) in message and words in message
    assert "training continues without trimtab" in message


def test_the_verl_plugin_reads_trimtab_token_file_from_the_environment_the_same_way(tmp_path, monkeypatch):
    path = tmp_path / "job.token"
    path.write_bytes(b"\xff\xfe")
    monkeypatch.setenv("TRIMTAB_SERVER", "http://127.0.0.1:9")
    monkeypatch.setenv("TRIMTAB_TOKEN_FILE", str(path))
    monkeypatch.delenv("TRIMTAB_TOKEN", raising=False)
    with pytest.raises(BadToken, match="binary or non-ASCII bytes") as caught:
        verl_plugin.settings({})
    assert str(caught.value) == the_one_message(path)


def test_a_good_token_file_reads_the_same_everywhere(tmp_path, monkeypatch):
    path = tmp_path / "job.token"
    path.write_text("tt_s3cret\n")
    monkeypatch.delenv("TRIMTAB_TOKEN", raising=False)
    got = verl_plugin.settings({"trimtab": {"server": "http://head:9460", "token_file": str(path)}})
    assert got["token"] == token_from(None, path) == "tt_s3cret"
