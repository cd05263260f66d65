"""What the benches share to run trimtab: for the simulated-job benches (``workloads.py``, ``moving_job.py``) a live
API on loopback over a fresh SQLite store with the real Rebalancer, and the ``--seeds`` syntax; for the benches that
load a server process (``report_latency.py``, ``server_load.py``) a real `trimtab server` on a loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import httpx


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


@contextmanager
def local_api(job_token_name: str, rules_file: Optional[str] = None) -> Iterator[tuple[httpx.Client, str]]:
    """A live API on loopback over a fresh SQLite store, the Rebalancer planning on every report: (an admin client,
    a job token). Shared by the benches that post simulated jobs' reports (``workloads.py``, ``moving_job.py``)."""
    from trimtab.api.app import create_app
    from trimtab.api.auth import ensure_admin_token
    from trimtab.api.context import ApiContext
    from trimtab.daemon import ApiServer
    from trimtab.grading.rules import load_rules
    from trimtab.control.service import Rebalancer
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    with tempfile.TemporaryDirectory(prefix="trimtab-workloads-") as tmp:
        engine = open_engine(f"sqlite:///{Path(tmp) / 'trimtab.db'}")
        migrate(engine)
        admin = ensure_admin_token(engine, Path(tmp)).read_text().strip()
        ctx = ApiContext(engine=engine, mode="up", state_dir=Path(tmp), rules=load_rules(rules_file))
        ctx.after_report = Rebalancer(engine, ctx.rules).after_report
        api = ApiServer(create_app(ctx), "127.0.0.1", 0).start()
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30,
                              headers={"Authorization": f"Bearer {admin}"}) as http:
                yield http, http.post("/v1/tokens", json={"name": job_token_name, "scope": "job"}).json()["token"]
        finally:
            api.stop()
            engine.dispose()


@contextmanager
def trimtab_server(db_url: str, state_dir: Path, start_timeout_s: float = 30.0,
                   env: Optional[dict] = None, own_session: bool = False) -> Iterator[tuple[str, str, int]]:
    """A real `trimtab server` over ``db_url`` on loopback (ephemeral port), stopped at the end; yields its URL,
    admin token, pid. Shared by the benches that load a server process (``report_latency.py``, ``server_load.py``);
    ``env``: variables the server gets on top of this process's. ``own_session``: the server in a session (and
    process group) of its own, for a bench that stops it with SIGSTOP: the kernel sends SIGCONT to every stopped
    process of a process group that becomes orphaned (the shell that started the bench exits), which ended a
    "600 s" outage after 4 s on 2026-12-06."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TRIMTAB_STATE_DIR": str(state_dir), "TRIMTAB_LOG_LEVEL": "warning", **(env or {})}
    server = subprocess.Popen([sys.executable, "-m", "trimtab.cli.main", "server", "--db", db_url,
                               "--port", str(port)], env=env, stderr=subprocess.DEVNULL,
                              start_new_session=own_session)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if server.poll() is not None:
                raise SystemExit(f"trimtab server exited with {server.returncode} before serving")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"trimtab server did not answer on {base} within {start_timeout_s:g} s")
            time.sleep(0.1)
        # admin.token for the state dir's own store, admin-<database>-<hash>.token for another one
        [token_file] = Path(state_dir).glob("admin*.token")
        yield base, token_file.read_text().strip(), server.pid
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # a stop slowed by a loaded machine must not lose the run's figures
            server.kill()
            server.wait(10)
