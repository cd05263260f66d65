"""A real Prometheus (the Debian package) scrapes /metrics served by uvicorn, and its query API returns the GPU
series with dcgm-exporter's labels and the snapshot's values.

Skips, saying why, where no ``prometheus`` binary is installed — unless ``TRIMTAB_REQUIRE_PROMETHEUS=1`` (CI),
where that fails the test.
"""

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

from trimtab.api.context import ApiContext
from trimtab.api.metrics import CONTENT_TYPE, render_metrics

from tests.support.procs import free_port, stop

from .conftest import Feeder

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


def test_prometheus_scrapes_gpu_series_with_dcgm_labels(ctx, feed: Feeder, tmp_path):
    binary = prometheus_binary()
    batch = feed.simulated(hostname="sim-prom", scenario="actor-hot", ticks=5)  # no more ticks: values stay put
    util = {s.gpu_uuid: s.util_pct for s in batch.gpu_samples}
    index = {g.uuid: str(g.index) for g in batch.gpus}

    with serve(metrics_app(ctx)) as app_port, prometheus(binary, app_port, tmp_path) as (prom_port, log):
        series = wait_for(prom_port, "DCGM_FI_DEV_GPU_UTIL", len(util), log)
        spread = wait_for(prom_port, 'trimtab_balance_status{check="utilization_spread"}', 1, log)

    assert len(series) == len(util)
    for s in series:
        labels, value = s["metric"], float(s["value"][1])
        assert {"gpu", "UUID", "modelName", "hostname"} <= set(labels), labels
        assert labels["hostname"] == "sim-prom" and labels["simulated"] == "true"
        assert labels["gpu"] == index[labels["UUID"]]
        assert labels["modelName"] == batch.gpus[0].name
        assert labels["job"] == "trimtab" and labels["instance"] == f"127.0.0.1:{app_port}"
        assert value == pytest.approx(util[labels["UUID"]])
    assert float(spread[0]["value"][1]) == 2  # actor-hot: act


def test_prometheus_stores_a_real_nodes_series_without_the_simulated_label_and_links_by_link(ctx, feed: Feeder,
                                                                                               tmp_path):
    from .test_exposition import real_node_batch

    binary = prometheus_binary()
    sim = feed.simulated(hostname="sim-prom", scenario="balanced", n_gpus=2, ticks=1)  # tick 0 reads every link
    feed(real_node_batch(int(time.time() * 1000)))
    with serve(metrics_app(ctx)) as app_port, prometheus(binary, app_port, tmp_path) as (prom_port, log):
        util = wait_for(prom_port, "DCGM_FI_DEV_GPU_UTIL", 3, log)
        links = wait_for(prom_port, "trimtab_gpu_nvlink_link_tx_bytes_per_second", len(sim.nvlink_samples), log)

    by_host = {}
    for s in util:
        by_host.setdefault(s["metric"]["hostname"], []).append(s["metric"])
    assert [m.get("simulated") for m in by_host["real-node"]] == [None]  # simulated="" is stored as no label
    assert {m["simulated"] for m in by_host["sim-prom"]} == {"true"}
    assert len(links) == 2 * 18 and {s["metric"]["hostname"] for s in links} == {"sim-prom"}
    expected = {(n.gpu_uuid, str(n.link)): n.tx_bytes_per_s for n in sim.nvlink_samples}
    assert {(s["metric"]["UUID"], s["metric"]["link"]): float(s["value"][1]) for s in links} == {
        key: pytest.approx(value) for key, value in expected.items()}
