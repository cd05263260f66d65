"""Per-link NVLink series are off /metrics by default (dcgm-exporter's default collectors export per-GPU NVLink
totals; per link they were ~70 % of a 1 000-GPU scrape's lines, issue 39), and come back with one switch: the
daemon's ``--metrics-nvlink-links`` (``TRIMTAB_METRICS_NVLINK_LINKS``) or a scrape's ``?nvlink_links=true``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.cli.main import cli

PER_LINK = {"trimtab_gpu_nvlink_link_tx_bytes_per_second", "trimtab_gpu_nvlink_link_rx_bytes_per_second",
            "trimtab_gpu_nvlink_link_timestamp_seconds"}
N_GPUS, N_LINKS = 2, 18


def _families(text: str) -> dict[str, int]:
    """Family name → its number of samples."""
    return {f.name: len(f.samples) for f in text_string_to_metric_families(text)}


def _fed_api(make_api, **ctx_options):
    api = make_api("sqlite", **ctx_options)
    sampler = Sampler([SimulatedNode(N_GPUS, "balanced", hostname="sim-links")], api.ctx.snapshot.update,
                      hostname="sim-links")
    assert len(sampler.tick().nvlink_samples) == N_GPUS * N_LINKS  # tick 0 reads every link
    return api


def test_per_link_series_are_absent_by_default_and_present_when_a_scrape_asks(make_api):
    api = _fed_api(make_api)
    default = _families(api.http.get("/metrics").text)
    assert not PER_LINK & set(default), sorted(PER_LINK & set(default))
    # the per-GPU totals stay: what dcgm-exporter exports and the dashboards query
    assert (default["DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND"] == default["DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND"]
            == N_GPUS)
    assert default["trimtab_gpu_nvlink_links"] == N_GPUS
    asked = _families(api.http.get("/metrics", params={"nvlink_links": "true"}).text)
    assert {name: asked.get(name) for name in PER_LINK} == {name: N_GPUS * N_LINKS for name in PER_LINK}
    assert set(asked) - PER_LINK == set(default)
    assert api.http.get("/metrics", params={"nvlink_links": "sometimes"}).status_code == 422


def test_a_daemon_started_with_the_switch_has_them_unless_a_scrape_says_false(make_api):
    api = _fed_api(make_api, metrics_nvlink_links=True)
    assert PER_LINK <= set(_families(api.http.get("/metrics").text))
    assert not PER_LINK & set(_families(api.http.get("/metrics", params={"nvlink_links": "false"}).text))


class Served(Exception):
    """Raised in place of serving: the context the command built is all the test needs."""


@pytest.mark.parametrize("command", ["up", "server"])
@pytest.mark.parametrize("how, expected", [((), False), (("--metrics-nvlink-links",), True),
                                           (("env",), True), (("--no-metrics-nvlink-links", "env"), False)])
def test_up_and_server_hand_the_switch_to_the_api(command, how, expected, tmp_path, monkeypatch):
    import trimtab.cli.serve_cmd as serve_cmd

    built = []

    def serve(ctx, host, port):
        built.append(ctx)
        raise Served

    monkeypatch.setattr(serve_cmd, "_serve", serve)
    env = {"TRIMTAB_METRICS_NVLINK_LINKS": "1"} if "env" in how else {}
    args = [command, "--db", f"sqlite:///{tmp_path}/t.db", "--state-dir", str(tmp_path), "--no-rebalance",
            *(a for a in how if a != "env")]
    if command == "up":
        args += ["--simulate", "1"]
    result = CliRunner().invoke(cli, args, env=env)
    assert isinstance(result.exception, Served), result.output
    assert [ctx.metrics_nvlink_links for ctx in built] == [expected]
