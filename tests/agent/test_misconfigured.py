"""A configuration the store or server will never accept is not an outage: the agent says so once, in words that
say what to fix, reports itself failed and exits 78 (the units do not restart on it) — keeping what it sampled on
disk. An outage (connection refused) still spools and waits."""

import secrets
import threading
from urllib.parse import quote

import httpx
import pytest
from click.testing import CliRunner

from trimtab.agent.runner import Agent, make_sources
from trimtab.agent.sinks import HttpSink
from trimtab.cli.main import cli
from trimtab.paths import EXIT_MISCONFIGURED
from tests.store.conftest import pg_admin_or_skip
from tests.support.procs import drain, notify_listener, trimtab


def run_agent(tmp_path, *args, timeout_s=60, env=None):
    proc = trimtab("agent", "--simulate", "1", "--interval", "0.1", "--status-every", "0.5",
                   "--state-dir", str(tmp_path / "state"), *args, env=env)
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err


def spooled(tmp_path) -> list:
    return [p for p in (tmp_path / "state" / "spool").rglob("*") if p.is_file() and p.stat().st_size > 0]


@pytest.mark.postgres
def test_a_database_that_does_not_exist_stops_the_agent_once_with_what_to_do(tmp_path):
    base, _ = pg_admin_or_skip()
    name = f"trimtab_missing_{secrets.token_hex(3)}"
    url = base.rsplit("/", 1)[0] + f"/{name}"
    code, err = run_agent(tmp_path, "--db", url, "--duration", "40")
    assert code == EXIT_MISCONFIGURED, err
    assert f"the database {name} does not exist: create it (createdb {name})" in err
    assert err.count("refuses this agent") == 1, "said once, not once a retry"
    assert "Traceback" not in err
    assert spooled(tmp_path), "what was sampled before it stopped is kept in the spool"


@pytest.mark.postgres
def test_a_schema_that_was_never_created_says_create_schema(tmp_path):
    base, _ = pg_admin_or_skip()
    schema = f"trimtab_noschema_{secrets.token_hex(3)}"
    url = f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={schema}')}"
    code, err = run_agent(tmp_path, "--db", url, "--duration", "40")
    assert code == EXIT_MISCONFIGURED, err
    assert "CREATE SCHEMA" in err and "search_path" in err
    assert "LINE 2" not in err and "CREATE TABLE" not in err, "no SQL in the message"


def test_a_store_that_refuses_connections_is_an_outage_spooled_and_waited_for(tmp_path):
    from tests.support.procs import free_port

    code, err = run_agent(tmp_path, "--db", f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
                          "--duration", "2")
    assert code == 0, err
    assert "unreachable, spooling" in err and "refuses this agent" not in err
    assert spooled(tmp_path)


def test_a_token_the_server_does_not_know_stops_the_agent_with_exit_78(sqlite_api, tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = notify_listener(sock_path, timeout_s=0.5)
    try:
        code, err = run_agent(tmp_path, "--server", sqlite_api.url, "--token", "tt_" + "x" * 43, "--duration", "40",
                              env={"NOTIFY_SOCKET": str(sock_path)})
        messages = drain(sock)
    finally:
        sock.close()
    assert code == EXIT_MISCONFIGURED, err
    assert [m for m in messages if m.startswith("STATUS=failed: ") and "HTTP 401" in m], messages
    assert messages[-1] == "STOPPING=1"
    assert "answered HTTP 401" in err and "does not know this token" in err
    assert err.count("refuses this agent") == 1
    assert not (tmp_path / "state" / "spool" / "rejected").exists(), "not one refused batch per second"


def test_a_token_of_the_wrong_scope_says_which_scope_is_needed(sqlite_api, tmp_path):
    code, err = run_agent(tmp_path, "--server", sqlite_api.url, "--token", sqlite_api.token("job"),
                          "--duration", "40")
    assert code == EXIT_MISCONFIGURED, err
    assert "HTTP 403" in err and "scope 'agent'" in err


def test_healthz_says_failed_while_the_agent_is_refused(sqlite_api, tmp_path):
    agent = Agent(make_sources(simulate=1), HttpSink(sqlite_api.url, "tt_wrong"), tmp_path / "spool",
                  interval_s=0.05, hostname="refused-node")
    agent.run(threading.Event(), duration_s=20)  # stops by itself once the server refuses the token
    assert agent.failed is not None and "401" in agent.failed
    sqlite_api.ctx.component_status = lambda: {"agent": agent.health()}
    r = httpx.get(f"{sqlite_api.url}/healthz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "failed" and body["components"]["agent"]["state"] == "failed"
    assert "does not know this token" in body["components"]["agent"]["failed"]


@pytest.mark.postgres
def test_up_on_a_database_that_does_not_exist_exits_78_naming_it(tmp_path):
    base, _ = pg_admin_or_skip()
    url = base.rsplit("/", 1)[0] + "/trimtab_missing_up"
    res = CliRunner().invoke(cli, ["up", "--simulate", "1", "--db", url, "--state-dir", str(tmp_path)])
    assert res.exit_code == EXIT_MISCONFIGURED, res.output
    assert "the database trimtab_missing_up does not exist" in res.output
