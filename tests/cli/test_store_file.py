"""The SQLite file a user sees is the store: a damaged one is a configuration error for every command that opens it
(one line naming the file and what is wrong, exit 78 — check keeps its own 2 — the file left byte for byte as it
was, nothing sampled or spooled), and a clean stop of `up`, `server` and `agent --db` leaves the data in the file
itself, not in its WAL."""

import shutil
import sqlite3

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.paths import EXIT_MISCONFIGURED
from tests.support.procs import free_port, trimtab
from tests.support.waits import eventually


def a_store_with_samples(tmp_path):
    """A real store of a few hundred rows, written by the agent and checkpointed into its file."""
    path = tmp_path / "made.db"
    proc = trimtab("agent", "--db", f"sqlite:///{path}", "--simulate", "2", "--interval", "0.05", "--duration", "2",
                   "--state-dir", str(tmp_path / "made-state"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture(params=["truncated", "random bytes"])
def damaged(request, tmp_path):
    path = tmp_path / "trimtab.db"
    if request.param == "truncated":
        whole = a_store_with_samples(tmp_path).read_bytes()
        path.write_bytes(whole[:len(whole) // 2])
    else:
        path.write_bytes(bytes(range(256)) * 40)
    return path


@pytest.mark.parametrize("command", [
    ["agent", "--simulate", "1", "--interval", "0.1", "--duration", "3"],
    ["up", "--simulate", "1", "--port", "0", "--duration", "3"],
    ["server", "--port", "0", "--duration", "3"],
    ["token", "list"],
])
def test_a_damaged_store_is_a_configuration_error_in_one_line_and_is_left_untouched(damaged, tmp_path, command):
    before = damaged.read_bytes()
    state = tmp_path / "state"
    where = ["--state-dir", str(state)] if command[0] != "token" else []
    res = CliRunner().invoke(cli, [*command, "--db", f"sqlite:///{damaged}", *where])
    assert res.exit_code == EXIT_MISCONFIGURED, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(damaged) in lines[0] and "damaged" in lines[0], lines[0]
    assert ("malformed" in lines[0]) or ("not a database" in lines[0])
    assert damaged.read_bytes() == before, "the file is left byte for byte as it was"
    assert not (state / "spool").exists() or not any((state / "spool").rglob("*.*")), "nothing sampled or spooled"


def test_check_says_the_same_and_keeps_its_exit_2(damaged):
    before = damaged.read_bytes()
    res = CliRunner().invoke(cli, ["check", "--db", f"sqlite:///{damaged}"])
    assert res.exit_code == 2, res.output
    assert "damaged" in res.stderr and str(damaged) in res.stderr
    assert damaged.read_bytes() == before


def rows_in_the_file_alone(path, tmp_path, table: str) -> int:
    """Copy only the file a user sees (not -wal, -shm) and count ``table``'s rows in the copy."""
    copy = tmp_path / "copy" / "trimtab.db"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("command,table", [
    (["agent", "--simulate", "2", "--interval", "0.05"], "gpu_samples"),
    (["up", "--simulate", "2", "--interval", "0.05", "--port", "0"], "gpu_samples"),
    (["server", "--no-rebalance"], "api_tokens"),  # the first admin token it made
])
def test_a_clean_stop_leaves_the_data_in_the_store_file_itself(tmp_path, command, table):
    """Also while another program (Grafana's SQLite source, a shell) has the store open: SQLite's own checkpoint
    at the last close then never comes."""
    path = tmp_path / "trimtab.db"
    extra = ["--port", str(free_port())] if command[0] == "server" else []
    proc = trimtab(*command, *extra, "--db", f"sqlite:///{path}", "--duration", "4", "--state-dir",
                   str(tmp_path / "state"))
    eventually(lambda: path.exists() and path.stat().st_size > 0, timeout_s=30)
    idle_reader = sqlite3.connect(path)  # open, no transaction: it does not stop a checkpoint
    idle_reader.execute("SELECT count(*) FROM sqlite_master").fetchone()  # it has read: it holds the WAL index
    try:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        wal = tmp_path / "trimtab.db-wal"
        assert not wal.exists() or wal.stat().st_size == 0, "the WAL was checkpointed into the file"
        assert rows_in_the_file_alone(path, tmp_path, table) > 0
    finally:
        idle_reader.close()
