"""A real Prometheus (the Debian package) scrapes /metrics served by uvicorn, and its query API returns the GPU
series with dcgm-exporter's names, labels and units — of its current generation, or of the legacy one when
``metrics_dcgm_names`` says so — and the snapshot's values.

Skips, saying why, where no ``prometheus`` binary is installed — unless ``TRIMTAB_REQUIRE_PROMETHEUS=1`` (CI),
where that fails the test.
"""

from __future__ import annotations

import time

import pytest

from tests.support.prometheus import metrics_app, prometheus, prometheus_binary, query, serve, wait_for

from .conftest import Feeder



# generation → (utilization series, its value from util_pct, the host labels a GPU series carries)
GENERATIONS = {"current": ("DCGM_FI_DEV_GPU_UTIL_RATIO", lambda pct: pct / 100, {"hostname"}),
               "legacy": ("DCGM_FI_DEV_GPU_UTIL", lambda pct: pct, {"hostname", "Hostname"})}


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_prometheus_scrapes_gpu_series_with_dcgm_labels(ctx, feed: Feeder, tmp_path, generation):
    binary = prometheus_binary()
    name, value_of, host_labels = GENERATIONS[generation]
    ctx.metrics_dcgm_names = generation
    batch = feed.simulated(hostname="sim-prom", scenario="actor-hot", ticks=5)  # no more ticks: values stay put
    util = {s.gpu_uuid: s.util_pct for s in batch.gpu_samples}
    index = {g.uuid: str(g.index) for g in batch.gpus}

    with serve(metrics_app(ctx)) as app_port, prometheus(binary, app_port, tmp_path) as (prom_port, log):
        series = wait_for(prom_port, name, len(util), log)
        spread = wait_for(prom_port, 'trimtab_balance_status{check="utilization_spread"}', 1, log)
        other = query(prom_port, GENERATIONS["legacy" if generation == "current" else "current"][0])

    assert len(series) == len(util) and other == []
    for s in series:
        labels, value = s["metric"], float(s["value"][1])
        assert {"gpu", "UUID", "modelName"} | host_labels <= set(labels), labels
        assert ({"hostname", "Hostname"} - host_labels).isdisjoint(labels), labels
        assert all(labels[h] == "sim-prom" for h in host_labels) and labels["simulated"] == "true"
        assert labels["gpu"] == index[labels["UUID"]]
        assert labels["modelName"] == batch.gpus[0].name
        assert labels["job"] == "trimtab" and labels["instance"] == f"127.0.0.1:{app_port}"
        assert value == pytest.approx(value_of(util[labels["UUID"]]))
    assert float(spread[0]["value"][1]) == 2  # actor-hot: act


def test_prometheus_stores_a_real_nodes_series_without_the_simulated_label_and_links_by_link(ctx, feed: Feeder,
                                                                                               tmp_path):
    from .test_exposition import real_node_batch

    binary = prometheus_binary()
    ctx.metrics_nvlink_links = True  # per-link series are off by default (--metrics-nvlink-links)
    sim = feed.simulated(hostname="sim-prom", scenario="balanced", n_gpus=2, ticks=1)  # tick 0 reads every link
    feed(real_node_batch(int(time.time() * 1000)))
    with serve(metrics_app(ctx)) as app_port, prometheus(binary, app_port, tmp_path) as (prom_port, log):
        util = wait_for(prom_port, "DCGM_FI_DEV_GPU_UTIL_RATIO", 3, log)
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
