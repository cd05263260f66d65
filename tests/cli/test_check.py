"""`trimtab check` grades each simulated scenario correctly, in JSON and as a table, with the documented exit codes."""

import json

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
    assert "cannot read the store" in res.stderr


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
