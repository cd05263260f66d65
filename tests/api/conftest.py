"""The real app served by uvicorn on an ephemeral loopback port, over a fresh store (SQLite file, PostgreSQL
schema), talked to over real HTTP with httpx.

``api`` runs each test on both backends; ``sqlite_api`` where the backend cannot matter (auth, validation).
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
import uvicorn

from trimtab.contract.readings import Batch, NodeInfo
from trimtab.api.app import create_app
from trimtab.api.auth import ensure_admin_token
from trimtab.api.context import ApiContext
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate
from tests.store.conftest import make_batch

SIM_NODE = NodeInfo(hostname="node-b-sim", simulated=True, scenario="actor-hot")
REAL_NODE = NodeInfo(hostname="node-a", driver_version="550.54", nvml_version="12.550")


class ServedApp:
    """uvicorn serving ``app`` on 127.0.0.1 in a background thread, on a port the kernel picked."""

    def __init__(self, app):
        # port=0: the kernel picks a free port at bind time (no race with another test taking it first).
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.port = 0

    def __enter__(self) -> "ServedApp":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.005)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self.join()

    def stop(self) -> None:
        self.server.should_exit = True  # uvicorn notices within its 0.1 s tick

    def join(self) -> None:
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Api:
    """A served app and what tests need around it: its context, an HTTP client and the admin token."""

    ctx: ApiContext
    url: str
    http: httpx.Client
    admin_token: str
    admin_token_file: Path
    _tokens: dict[str, str] = field(default_factory=dict)

    def auth(self, token: Optional[str]) -> dict[str, str]:
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def token(self, scope: str) -> str:
        """A token of ``scope`` (one per scope and test, created through the API)."""
        if scope not in self._tokens:
            r = self.post("/v1/tokens", {"name": f"test {scope}", "scope": scope}, token=self.admin_token)
            assert r.status_code == 201, r.text
            self._tokens[scope] = r.json()["token"]
        return self._tokens[scope]

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.http.get(path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any, token: Optional[str] = None, scope: Optional[str] = None,
             method: str = "POST") -> httpx.Response:
        if scope is not None:
            token = self.token(scope)
        return self.http.request(method, path, json=body, headers=self.auth(token))

    def ingest(self, batch: Batch, token: Optional[str] = None) -> httpx.Response:
        return self.http.post("/v1/ingest", content=batch.to_json(), headers={
            "Content-Type": "application/json", **self.auth(token or self.token("agent"))})


def now_ms() -> int:
    return int(time.time() * 1000)


def recent_batch(node: NodeInfo = REAL_NODE, n_gpus: int = 2, seconds: int = 3, **metrics) -> Batch:
    """A batch of the last few seconds (so it counts as the GPUs' latest sample), one sample a second."""
    end = now_ms() - now_ms() % 1000
    prefix = f"GPU-{node.hostname}-"
    metrics.setdefault("util_pct", lambda i, _t: 30.0 + 10.0 * i)
    return make_batch([end - 1000 * i for i in reversed(range(seconds))], n_gpus=n_gpus, node=node,
                      uuid_prefix=prefix, **metrics)


@pytest.fixture(scope="session")
def stopping_servers():
    """Servers told to stop, joined once at the end: waiting for each one's shutdown tick would cost ~0.15 s a test."""
    servers: list[ServedApp] = []
    yield servers
    for served in servers:
        served.join()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """An empty, migrated SQLite store to copy: a file copy is much cheaper than running the migrations again."""
    path = tmp_path_factory.mktemp("template") / "trimtab.db"
    engine = open_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()  # the last connection's close checkpoints the WAL into the file
    return path


@pytest.fixture
def make_api(tmp_path, stopping_servers, migrated_sqlite):
    """Serves a fresh app over the store at ``url`` (``sqlite`` alone: a fresh copy of a migrated SQLite store);
    the servers and engines are shut down after the test."""
    opened = []

    def start(url: str, **ctx_options) -> Api:
        if url == "sqlite":
            copy = tmp_path / f"store{len(opened)}" / "trimtab.db"
            copy.parent.mkdir()
            shutil.copyfile(migrated_sqlite, copy)
            url = f"sqlite:///{copy}"
        engine = open_engine(url)
        migrate(engine)  # a no-op on the copy
        state_dir = tmp_path / f"state{len(opened)}"
        admin_file = ensure_admin_token(engine, state_dir)
        ctx = ApiContext(engine=engine, mode=ctx_options.pop("mode", "up"), state_dir=state_dir, **ctx_options)
        served = ServedApp(create_app(ctx)).__enter__()
        http = httpx.Client(base_url=served.url, timeout=30)
        opened.append((served, http, engine))
        return Api(ctx, served.url, http, admin_file.read_text().strip(), admin_file)

    yield start
    for served, http, engine in opened:
        http.close()
        served.stop()
        stopping_servers.append(served)
        engine.dispose()


@pytest.fixture
def sqlite_api(make_api) -> Api:
    return make_api("sqlite")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api(request, make_api) -> Api:
    if request.param == "sqlite":
        return make_api("sqlite")
    return make_api(request.getfixturevalue("pg_migrated_url"))
