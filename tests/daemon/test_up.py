"""`trimtab up` on a machine without a driver: a simulated node, said at start-up and in every response, that
`trimtab check --server` grades through the API; and the daemon refuses to expose itself without tokens."""

import json

import httpx

from tests.support.procs import free_port, stop, trimtab, wait_http
from tests.support.waits import eventually


def samples_of_every_gpu(base: str, at_least: int):
    """/v1/gpus once each of the 4 GPUs has ``at_least`` samples in the last 10 s (check's window), else None."""
    gpus = httpx.get(f"{base}/v1/gpus").json()
    counts = [len(httpx.get(f"{base}/v1/gpus/{g['uuid']}/samples", params={"window_s": 10, "resolution": "raw"})
                  .json()["points"]) for g in gpus["gpus"]]
    return gpus if len(counts) == 4 and min(counts) >= at_least else None


def test_up_serves_a_simulated_node_that_check_grades_over_http(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = trimtab("up", "--simulate", "4", "--scenario", "actor-hot", "--port", str(port), "--interval", "0.2",
                   env={"TRIMTAB_STATE_DIR": str(tmp_path)})
    try:
        wait_http(f"{base}/healthz", proc=proc)
        gpus = eventually(lambda: samples_of_every_gpu(base, at_least=3), timeout_s=30)  # what check grades
        assert gpus["simulated"] is True
        ledger = eventually(lambda: (h := httpx.get(f"{base}/healthz").json()["components"]["ledger"])["ticks"] >= 1
                            and h, timeout_s=30)  # the GPU-time ledger's ticker runs beside the API (at start)
        assert ledger["state"] == "ok" and ledger["period_s"] == 15.0
        check = trimtab("check", "--server", base, "--window", "10", "--json")
        out, err = check.communicate(timeout=60)
        assert check.returncode == 1, err
        report = json.loads(out)
        assert report["simulated"] is True
        assert [v["status"] for v in report["nodes"][0]["verdicts"] if v["check"] == "utilization_spread"] == ["act"]
        assert (tmp_path / "admin.token").stat().st_mode & 0o777 == 0o600
    finally:
        _, err = stop(proc)
    assert "SIMULATED" in err and "admin.token" in err


def test_a_non_loopback_bind_without_tokens_is_refused(tmp_path):
    proc = trimtab("up", "--simulate", "1", "--host", "0.0.0.0", "--port", str(free_port()),
                   env={"TRIMTAB_STATE_DIR": str(tmp_path)})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "refusing to listen on 0.0.0.0" in err and "no API token" in err


def test_tokens_made_on_the_command_line_open_a_non_loopback_bind(tmp_path):
    from click.testing import CliRunner

    from trimtab.cli.main import cli

    db = f"sqlite:///{tmp_path}/t.db"
    res = CliRunner().invoke(cli, ["token", "create", "--db", db, "--name", "head", "--scope", "admin",
                                   "--out", str(tmp_path / "admin.tok")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "admin.tok").stat().st_mode & 0o777 == 0o600
    listed = CliRunner().invoke(cli, ["token", "list", "--db", db])
    assert "admin" in listed.output and "active" in listed.output
    # With a token in the store the bind guard lets a non-loopback address through (checked without binding one:
    # tests listen on loopback only).
    from trimtab.cli.serve_cmd import _guard_bind
    from trimtab.store.engine import open_engine

    engine = open_engine(db)
    _guard_bind(engine, "192.0.2.10", tmp_path)  # does not raise
    engine.dispose()
    port = free_port()
    proc = trimtab("server", "--db", db, "--port", str(port), env={"TRIMTAB_STATE_DIR": str(tmp_path)})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        secret = (tmp_path / "admin.tok").read_text().strip()
        r = httpx.get(f"http://127.0.0.1:{port}/v1/tokens", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200
    finally:
        stop(proc)
    token_id = listed.output.split()[0]
    assert CliRunner().invoke(cli, ["token", "revoke", "--db", db, token_id]).exit_code == 0
    assert "revoked" in CliRunner().invoke(cli, ["token", "list", "--db", db]).output


COUNT_ENGINES = """
import json, sys

import trimtab.store.engine as store_engine
import trimtab.store.sqlite_pragmas as sqlite_pragmas

opened = []
for module in (store_engine, sqlite_pragmas):  # PostgreSQL engines are made in the one, SQLite engines in the other
    module.create_engine = (lambda create: lambda url, *a, **kw: opened.append(str(url)) or create(url, *a, **kw))(
        module.create_engine)
from trimtab.cli.main import cli

try:
    cli(sys.argv[1:], prog_name="trimtab")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "opened": opened}))
"""


def test_up_opens_one_engine_for_its_store_that_the_api_and_the_agent_share(tmp_path):
    import subprocess
    import sys

    from sqlalchemy import create_engine, text

    db = f"sqlite:///{tmp_path}/up.db"
    out = subprocess.run([sys.executable, "-c", COUNT_ENGINES, "up", "--simulate", "1", "--port", "0", "--interval",
                          "0.2", "--duration", "2", "--db", db, "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=90)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["code"] in (0, None), out.stderr
    assert len(got["opened"]) == 1 and got["opened"][0].endswith("up.db"), got["opened"]
    engine = create_engine(db)
    with engine.connect() as conn:  # the agent did write, through that engine
        assert conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar_one() > 0
    engine.dispose()


def test_the_commands_the_first_start_suggests_run_as_printed(tmp_path, capsys, monkeypatch):
    """The first-start line names `trimtab token create …` commands: each works as printed (with --db added)."""
    import re
    import shlex

    from click.testing import CliRunner

    from trimtab.cli.main import cli
    from trimtab.cli.serve_cmd import _guard_bind
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    db = f"sqlite:///{tmp_path}/t.db"
    engine = open_engine(db)
    migrate(engine)
    try:
        _guard_bind(engine, "127.0.0.1", tmp_path)
    finally:
        engine.dispose()
    line = capsys.readouterr().err
    suggested = re.findall(r"`(trimtab token create[^`]*)`", line)
    assert suggested, line
    scopes = set()
    monkeypatch.chdir(tmp_path)  # where a relative --out lands
    for command in suggested:
        words = shlex.split(command)[1:]
        res = CliRunner().invoke(cli, [*words, "--db", db])
        assert res.exit_code == 0, (command, res.output)
        scopes.add(words[words.index("--scope") + 1])
    assert scopes == {"agent", "job"}
