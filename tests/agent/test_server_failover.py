"""The agent ships to several servers (issue 39: no single point of failure at the head): a batch the first server
cannot take goes to the next, shipping returns to the first once it answers again, only a batch no server takes
is spooled, and nothing is stored twice. `--server` takes the list comma-separated, repeated, from TRIMTAB_SERVER
or from trimtab.toml alike."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import uvicorn
from click.testing import CliRunner
from sqlalchemy import func, select

from tests.api.conftest import ServedApp
from tests.store.conftest import make_batch
from tests.support.procs import free_port
from trimtab.agent.sinks import HttpSink, server_urls
from trimtab.api.auth import create_token
from trimtab.api.app import create_app
from trimtab.api.context import ApiContext
from trimtab.contract.readings import NodeInfo
from trimtab.contract.sink import SinkUnavailable
from trimtab.store.engine import open_engine
from trimtab.store.models import gpu_samples


class OnPort:
    """An app served on a port chosen before it listens (the first server, down at the start, back later)."""

    def __init__(self, app, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="on", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.005)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def one_store(tmp_path, migrated_sqlite):
    """The store both servers serve (a copy of a migrated one)."""
    shutil.copyfile(migrated_sqlite, tmp_path / "shared.db")
    engine = open_engine(f"sqlite:///{tmp_path}/shared.db")
    yield engine
    engine.dispose()


def stored(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(gpu_samples)).scalar_one()


def batch(hostname: str = "node-a", at_s: float = 0.0):
    return make_batch([int((time.time() - 60 + at_s) * 1000)], node=NodeInfo(hostname=hostname),
                      uuid_prefix=f"GPU-{hostname}-", util_pct=50.0)


def hosts(ctx: ApiContext) -> set[str]:
    return {snap.node.hostname for snap in ctx.snapshot.nodes()}


def test_batches_fail_over_to_the_next_server_and_come_back_to_the_first(one_store, tmp_path):
    token = create_token(one_store, "agents", "agent")[1]
    ctx_a, ctx_b = (ApiContext(engine=one_store, mode="server", state_dir=tmp_path / n) for n in "ab")
    port_a = free_port()  # nothing listens there yet: the first server is down
    with ServedApp(create_app(ctx_b)) as b:
        sink = HttpSink(f"http://127.0.0.1:{port_a}, {b.url}/", token, primary_retry_s=0.2)
        assert sink.servers == [f"http://127.0.0.1:{port_a}", b.url]
        assert sink.write(batch("first", 1)) > 0   # refused by the first, taken by the second
        assert sink.active == 1 and sink.failovers == 1 and hosts(ctx_b) == {"first"}

        a = OnPort(create_app(ctx_a), port_a)                             # the first server comes back …
        try:
            time.sleep(0.3)                                               # … and is due another try
            sink.write(batch("second", 2))
            assert sink.active == 0 and hosts(ctx_a) == {"second"}        # shipping is back on the first
            sink.write(batch("third", 3))            # and stays there
            assert hosts(ctx_a) == {"second", "third"} and hosts(ctx_b) == {"first"}
        finally:
            a.stop()
        sink.write(batch("fourth", 4))               # the first dies again: the second
        assert sink.active == 1 and hosts(ctx_b) == {"first", "fourth"}
        sink.close()
    per_batch = stored(one_store) // 4
    assert per_batch > 0 and stored(one_store) == 4 * per_batch          # each batch stored once


def test_a_batch_no_server_takes_is_not_now_naming_every_server(one_store):
    ports = [free_port(), free_port()]
    sink = HttpSink([f"http://127.0.0.1:{p}" for p in ports], "tt_any")
    with pytest.raises(SinkUnavailable) as info:
        sink.write(batch())
    assert all(f"127.0.0.1:{p}" in str(info.value) for p in ports)       # the writer spools it, as for one server
    sink.close()


def test_server_urls_are_read_comma_separated_repeated_or_from_one_string():
    assert server_urls(("http://a:1, http://b:2/", "http://c:3", "http://a:1")) == \
        ["http://a:1", "http://b:2", "http://c:3"]
    assert server_urls("http://a:1,http://b:2") == ["http://a:1", "http://b:2"]
    assert server_urls(None) == [] and server_urls(()) == []


@pytest.mark.parametrize("how", ["flags", "env", "toml"])
def test_the_agent_command_takes_several_servers(how, tmp_path, monkeypatch):
    from trimtab.cli import agent_cmd
    from trimtab.cli.main import cli

    seen = {}

    def fake_sink(db_url, server_url, token):  # stop before sampling: what the command made of --server
        seen["servers"] = HttpSink(server_url, token).servers
        raise SystemExit(0)

    monkeypatch.setattr(agent_cmd, "_sink", fake_sink)
    args = ["agent", "--simulate", "1", "--token", "tt_x", "--spool-dir", str(tmp_path / "spool")]
    env = {}
    if how == "flags":
        args += ["--server", "http://a:1,http://b:2", "--server", "http://c:3"]
    elif how == "env":
        env["TRIMTAB_SERVER"] = "http://a:1,http://b:2 http://c:3"
    else:
        (tmp_path / "trimtab.toml").write_text('[agent]\nserver_url = "http://a:1, http://b:2, http://c:3"\n')
        monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert seen["servers"] == ["http://a:1", "http://b:2", "http://c:3"]


def test_a_server_url_without_its_scheme_is_a_usage_error_naming_it(tmp_path):
    """The agent and the hook read server URLs with one parser (``contract/servers.py``): ``head2:9460`` would be
    posted to as a relative path, so the command refuses it up front, in one line, before sampling."""
    from trimtab.cli.main import cli

    result = CliRunner().invoke(cli, ["agent", "--simulate", "1", "--token", "tt_x", "--spool-dir",
                                      str(tmp_path / "spool"), "--server", "http://a:1,head2:9460"])
    assert result.exit_code == 2, result.output
    assert "'head2:9460': it must start with http:// or https://" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
