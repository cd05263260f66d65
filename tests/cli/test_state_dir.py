"""The state directory is the one place for the admin token, the spool and the default store (``--state-dir``,
else ``$TRIMTAB_STATE_DIR``); ``--db`` moves only the store. What trimtab creates there is private from the first
byte, and a token file is 0600 even where an older, wider file or a symlink was."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.paths import use_state_dir
from tests.support.procs import free_port, trimtab


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(autouse=True)
def forget_the_state_dir():
    yield
    use_state_dir(None)  # --state-dir given to an in-process command must not leak into the next test


def run_up(tmp_path, *args, env=None):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "XDG_DATA_HOME": "", "TRIMTAB_STATE_DIR": "", "STATE_DIRECTORY": "",
           **(env or {})}
    proc = trimtab("up", "--simulate", "1", "--port", str(free_port()), "--interval", "0.1", "--duration", "1.5",
                   *args, env=env)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    return home, err


def test_state_dir_holds_token_spool_and_store_and_db_moves_only_the_store(tmp_path):
    state, elsewhere = tmp_path / "state", tmp_path / "data" / "elsewhere.db"
    home, err = run_up(tmp_path, "--state-dir", str(state), "--db", f"sqlite:///{elsewhere}")
    (token,) = state.glob("admin-elsewhere-*.token")  # another store's token: named after it, never admin.token
    assert token.is_file() and (state / "spool").is_dir() and not (state / "admin.token").exists()
    assert elsewhere.is_file() and not (state / "trimtab.db").exists()
    assert not any(home.rglob("*")), "nothing is written under ~ when a state dir is given"
    assert str(token) in err


def test_the_environment_names_the_state_dir_and_the_default_store_goes_there(tmp_path):
    state = tmp_path / "env-state"
    home, _ = run_up(tmp_path, env={"TRIMTAB_STATE_DIR": str(state)})
    assert {p.name for p in state.iterdir()} >= {"admin.token", "spool", "trimtab.db"}
    assert not any(home.rglob("*"))


def test_everything_created_in_the_state_dir_is_private_whatever_the_umask(tmp_path):
    state = tmp_path / "umask-state"
    old = os.umask(0o000)  # the child inherits the widest umask there is
    try:
        run_up(tmp_path, "--state-dir", str(state))
    finally:
        os.umask(old)
    assert mode(state) == 0o700 and mode(state / "spool") == 0o700
    assert mode(state / "admin.token") == 0o600
    assert mode(state / "trimtab.db") == 0o600
    assert all(mode(p) == 0o600 for p in state.glob("trimtab.db-*")), "WAL and shm take the store's mode"


def create_token(tmp_path, out) -> str:
    res = CliRunner().invoke(cli, ["token", "create", "--state-dir", str(tmp_path / "tok-state"), "--name", "t",
                                   "--scope", "job", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return res.output


def test_token_out_over_an_existing_world_readable_file_leaves_it_0600(tmp_path):
    out = tmp_path / "job.token"
    out.write_text("old\n")
    os.chmod(out, 0o644)
    create_token(tmp_path, out)
    assert mode(out) == 0o600 and out.read_text().startswith("tt_")
    assert (tmp_path / "tok-state" / "trimtab.db").exists(), "--state-dir names the default store"


def test_token_out_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    os.chmod(target, 0o644)
    link = tmp_path / "job.token"
    link.symlink_to(target)
    create_token(tmp_path, link)
    assert not link.is_symlink() and mode(link) == 0o600 and link.read_text().startswith("tt_")
    assert target.read_text() == "keep me\n" and mode(target) == 0o644


def test_token_out_makes_a_missing_directory_0700_and_one_it_cannot_make_leaves_no_token(tmp_path):
    out = tmp_path / "home" / ".config" / "trimtab" / "my-job.token"  # a fresh home: ~/.config may not exist
    create_token(tmp_path, out)
    assert mode(out) == 0o600 and mode(out.parent) == 0o700 and out.read_text().startswith("tt_")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    res = CliRunner().invoke(cli, ["token", "create", "--state-dir", str(tmp_path / "tok-state"), "--name", "t2",
                                   "--scope", "job", "--out", str(blocked / "sub" / "x.token")])
    assert res.exit_code == 1 and "cannot write" in res.output and "exists: revoke it" not in res.output
    listed = CliRunner().invoke(cli, ["token", "list", "--state-dir", str(tmp_path / "tok-state")])
    assert "t2" not in listed.output and listed.exit_code == 0, listed.output
