"""A real Prometheus (Debian's binary) scraping a /metrics endpoint on loopback, and waits on its query API with a
deadline; with TRIMTAB_REQUIRE_PROMETHEUS=1 (CI) a missing binary fails instead of skipping."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.procs import free_port, stop
from trimtab.api.context import ApiContext
from trimtab.api.metrics import CONTENT_TYPE, render_metrics

DEADLINE_S = 30.0


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or "/usr/bin/prometheus"
    if os.access(path, os.X_OK):
        return path
    reason = "no prometheus binary on PATH or at /usr/bin/prometheus (apt-get install -y prometheus)"
    if os.environ.get("TRIMTAB_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(f"{reason}; TRIMTAB_REQUIRE_PROMETHEUS=1 forbids skipping", pytrace=False)
    pytest.skip(reason)


def metrics_app(ctx: ApiContext):
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def metrics(_request):  # sync: Starlette runs it in its thread pool, as the real app's route does
        return Response(render_metrics(ctx), media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics)])


@contextmanager
def serve(app) -> Iterator[int]:
    """uvicorn on an ephemeral loopback port in a thread; yields the port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def prometheus(binary: str, target_port: int, workdir: Path) -> Iterator[tuple[int, Path]]:
    """Prometheus scraping 127.0.0.1:target_port every second; yields its port and its log file."""
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: trimtab\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
    port, log = free_port(), workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield port, log
    finally:
        stop(proc)


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=2) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(port: int, promql: str, n_series: int, log: Path) -> list[dict]:
    deadline, last = time.monotonic() + DEADLINE_S, "nothing yet"
    while time.monotonic() < deadline:
        try:
            result = query(port, promql)
            if len(result) >= n_series:
                return result
            last = f"{len(result)} series"
        except OSError as exc:  # Prometheus still starting
            last = repr(exc)
        time.sleep(0.25)
    pytest.fail(f"no {n_series} series for {promql} within {DEADLINE_S:.0f} s (last: {last}); "
                f"prometheus log:\n{log.read_text()[-3000:]}")
