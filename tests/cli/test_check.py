"""`trimtab check` grades each simulated scenario correctly, in JSON and as a table, with the documented exit codes."""

import json
import re

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli

EXPECTED = {  # scenario → (exit code, the check that must say "act")
    "balanced": (0, None),
    "actor-hot": (1, "utilization_spread"),
    "reward-memory": (1, "memory"),
    "pcie-saturated": (1, "pcie"),
}


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_live_check_of_each_simulated_scenario(scenario, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIMTAB_STATE_DIR", str(tmp_path))
    res = run("check", "--simulate", "4", "--scenario", scenario, "--window", "1.5", "--interval", "0.1", "--json")
    code, acting = EXPECTED[scenario]
    assert res.exit_code == code, res.output
    report = json.loads(res.stdout)
    assert report["simulated"] is True
    node = report["nodes"][0]
    assert node["simulated"] is True and len(node["gpus"]) == 4
    act = {v["check"] for v in node["verdicts"] if v["status"] == "act"}
    assert act == ({acting} if acting else set())
    job_rows = {v["check"]: v for v in node["verdicts"] if v["check"] in ("step_composition", "fragmentation", "collective_latency")}
    assert all(v["status"] == "no_data" and "no job data" in v["message"] for v in job_rows.values()) and len(job_rows) == 3


def test_check_reads_what_the_agent_stored(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    res = run("agent", "--db", db, "--simulate", "4", "--scenario", "actor-hot", "--interval", "0.1", "--duration", "1.5",
              "--spool-dir", str(tmp_path / "spool"))
    assert res.exit_code == 0, res.output
    res = run("check", "--db", db, "--window", "30")
    assert res.exit_code == 1, res.output
    assert "SIMULATED" in res.stdout and "OUT OF BALANCE" in res.stdout
    assert "unsupported" not in res.stdout  # the simulated node has NVLink
    assert "utilization_spread" in res.stdout and "no job data" in res.stdout


def test_no_store_is_an_error_not_a_verdict(tmp_path):
    res = run("check", "--db", f"sqlite:///{tmp_path}/missing.db", "--json")
    assert res.exit_code == 2
    assert json.loads(res.stdout)["status"] == "error"
    assert "no store at" in res.stderr


def test_a_store_without_recent_samples_is_an_error(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    assert run("agent", "--db", db, "--simulate", "2", "--interval", "0.1", "--duration", "0.3",
               "--spool-dir", str(tmp_path / "spool"), "--hostname", "nodeA").exit_code == 0
    res = run("check", "--db", db, "--node", "someone-else")
    assert res.exit_code == 2 and "no samples from node 'someone-else'" in res.stderr


def test_an_unreachable_database_is_exit_2():
    res = run("check", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert res.exit_code == 2
    assert "cannot open the store" in res.stderr and "Connection refused" in res.stderr


def test_agent_without_a_driver_says_how_to_simulate(monkeypatch):
    from trimtab.agent.nvml import NvmlSource
    from trimtab.agent.source import SourceUnavailable

    try:
        NvmlSource().close()
        pytest.skip("this machine has an NVIDIA driver")
    except SourceUnavailable:
        pass
    res = run("agent", "--duration", "0.1")
    assert res.exit_code == 1
    assert "--simulate" in res.output


def test_up_falling_back_to_simulation_does_not_tell_the_user_to_simulate(caplog):
    """`up` (fallback_gpus) already simulates: its warning says why, not "run `trimtab agent --simulate N`"."""
    from trimtab.agent.nvml import NvmlSource
    from trimtab.agent.runner import make_sources
    from trimtab.agent.source import SourceUnavailable

    try:
        NvmlSource().close()
        pytest.skip("this machine has an NVIDIA driver")
    except SourceUnavailable:
        pass
    with caplog.at_level("WARNING", logger="trimtab.agent.runner"):
        sources = make_sources(fallback_gpus=2)
    for source in sources:
        source.close()
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "starting a SIMULATED node of 2 GPUs" in warning and "--simulate" not in warning, warning


def test_live_check_reports_the_window_it_was_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIMTAB_STATE_DIR", str(tmp_path))
    res = run("check", "--simulate", "2", "--window", "1.5", "--interval", "0.1")
    assert "window: last 1.5 s," in res.stdout, res.stdout
    res = run("check", "--simulate", "2", "--window", "1.5", "--interval", "0.1", "--json")
    assert json.loads(res.stdout)["nodes"][0]["window_s"] == 1.5


def test_check_live_without_a_driver_suggests_check_simulate(tmp_path, monkeypatch):
    from trimtab.agent.nvml import NvmlSource
    from trimtab.agent.source import SourceUnavailable

    try:
        NvmlSource().close()
        pytest.skip("this machine has an NVIDIA driver")
    except SourceUnavailable:
        pass
    monkeypatch.setenv("TRIMTAB_STATE_DIR", str(tmp_path))
    res = run("check", "--live", "--window", "1")
    assert res.exit_code == 2
    assert "`trimtab check --simulate N`" in res.stderr and "trimtab agent" not in res.stderr


def test_a_rules_file_with_server_is_refused_not_ignored(tmp_path):
    rules = tmp_path / "x.toml"
    rules.write_text("[rules.pcie]\nact_above = 50\n")
    res = run("check", "--server", "http://127.0.0.1:9", "--rules-file", str(rules))
    assert res.exit_code == 2
    assert f"--rules-file {rules} cannot apply with --server" in res.stderr


def test_a_rules_file_changes_the_node_verdicts_it_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIMTAB_STATE_DIR", str(tmp_path))
    args = ("check", "--simulate", "4", "--scenario", "actor-hot", "--window", "1", "--interval", "0.2")
    assert run(*args).exit_code == 1  # the shipped act line (40 pts) is crossed
    rules = tmp_path / "loose.toml"
    rules.write_text("[rules.utilization_spread]\nhealthy_below = 98\nact_above = 99\n")
    res = run(*args, "--rules-file", str(rules), "--json")
    assert res.exit_code == 0, res.output
    spread = next(v for v in json.loads(res.stdout)["nodes"][0]["verdicts"] if v["check"] == "utilization_spread")
    assert spread["status"] == "ok"


def test_a_toml_syntax_error_names_the_file_and_the_line_even_at_its_end(tmp_path):
    rules = tmp_path / "bad.toml"
    rules.write_text("[rules.pcie]\nact_above = 95\nhealthy_below = ")  # unfinished on its last line
    res = run("check", "--db", f"sqlite:///{tmp_path}/none.db", "--rules-file", str(rules))
    assert res.exit_code == 2
    assert f"{rules}: Invalid value (at line 3, the end of the file)" in res.stderr
    res = run("--config", str(rules), "check")
    assert res.exit_code == 2 and f"{rules}: Invalid value (at line 3" in res.output


@pytest.mark.postgres
def test_check_on_an_empty_postgresql_database_says_to_start_trimtab_once_not_sql():
    import secrets

    from sqlalchemy import text

    from tests.store.conftest import pg_admin_or_skip

    base, admin = pg_admin_or_skip()
    name = f"trimtab_empty_{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = base.rsplit("/", 1)[0] + f"/{name}"
        res = run("check", "--db", url.replace("postgresql+psycopg://", "postgres://"))
        assert res.exit_code == 2
        assert f"read as {url}" in res.stderr, "postgres:// is accepted, and the command says how it read it"
        assert "no trimtab tables in" in res.stderr and "`trimtab agent`, `trimtab up` or `trimtab server`" in res.stderr
        assert "SQL" not in res.stderr and "relation" not in res.stderr
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))


def test_a_stopped_agent_makes_check_exit_non_zero_at_once_naming_the_node_and_the_age(tmp_path):
    """A script gating on `check` must not pass on a dead node: once the newest sample is older than
    stale_after_intervals sampling intervals, check exits 2 naming the node and the age — not 30 s later, when the
    window empties. (stale_min_s = 0 here, so that 5 intervals of 0.2 s decide; the shipped floor is 3 s.)"""
    import signal
    import time

    from tests.support.procs import stop, trimtab
    from tests.support.waits import eventually

    db = f"sqlite:///{tmp_path}/t.db"
    rules = tmp_path / "rules.toml"
    rules.write_text("[controller]\nstale_after_intervals = 5\nstale_min_s = 0\n")
    agent = trimtab("agent", "--db", db, "--simulate", "2", "--interval", "0.2", "--hostname", "node-7",
                    "--spool-dir", str(tmp_path / "spool"))
    try:
        deadline = time.monotonic() + 60
        while True:  # until the agent has stored a few ticks
            res = run("check", "--db", db, "--rules-file", str(rules), "--json")
            if res.exit_code == 0 and json.loads(res.stdout)["nodes"][0]["gpus"][0]["n_samples"] >= 4:
                break
            assert time.monotonic() < deadline and agent.poll() is None, res.output
            time.sleep(0.3)
        node = json.loads(res.stdout)["nodes"][0]
        assert node["stale"] is False and node["sample_interval_s"] == pytest.approx(0.2, abs=0.1)
    finally:
        stop(agent, signal.SIGKILL)  # the agent dies
    # stale once its newest sample is older than 5 × 0.2 s, far less than the 30 s window
    res = eventually(lambda: (r := run("check", "--db", db, "--rules-file", str(rules))).exit_code == 2 and r,
                     timeout_s=30, interval_s=0.2)
    age = float(re.search(r"node node-7 is STALE: its newest sample is ([0-9.]+) s old", res.stderr).group(1))
    assert 1.0 <= age < 30, res.stderr
    assert "STALE" in res.stdout and "BALANCED" not in res.stdout
    body = json.loads(run("check", "--db", db, "--rules-file", str(rules), "--json").stdout)
    assert body["status"] == "stale" and body["balanced"] is False and body["nodes"][0]["stale"] is True


def test_the_shipped_freshness_rule_is_five_intervals_and_at_least_three_seconds(tmp_path):
    from trimtab.grading.rules import default_rules

    ctl = default_rules().controller
    assert (ctl.stale_after_intervals, ctl.stale_min_s) == (5.0, 3.0)
    db = f"sqlite:///{tmp_path}/t.db"
    assert run("agent", "--db", db, "--simulate", "1", "--interval", "1", "--duration", "2.5",
               "--spool-dir", str(tmp_path / "spool")).exit_code == 0
    node = json.loads(run("check", "--db", db, "--json").stdout)["nodes"][0]
    assert node["stale"] is False and node["stale_after_s"] == pytest.approx(5 * node["sample_interval_s"])
