"""One switch picks the dcgm-exporter generation /metrics names its DCGM series after: the daemon's
``--metrics-dcgm-names current|legacy`` (``TRIMTAB_METRICS_DCGM_NAMES``, ``metrics_dcgm_names`` in trimtab.toml),
current by default; a value that is neither is refused before anything starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.cli.main import cli


class Served(Exception):
    """Raised in place of serving: the context the command built is all the test needs."""


def _built(command: str, args: list[str], tmp_path, monkeypatch, env: dict[str, str], before: tuple = ()):
    """Run ``trimtab [before] command … args`` up to serving; the exit result and the contexts it built."""
    import trimtab.cli.serve_cmd as serve_cmd

    built = []

    def serve(ctx, host, port):
        built.append(ctx)
        raise Served

    monkeypatch.setattr(serve_cmd, "_serve", serve)
    full = [*before, command, "--db", f"sqlite:///{tmp_path}/t.db", "--state-dir", str(tmp_path), "--no-rebalance",
            *args, *(["--simulate", "1"] if command == "up" else [])]
    result = CliRunner().invoke(cli, full, env=env)
    return result, built


@pytest.mark.parametrize("command", ["up", "server"])
@pytest.mark.parametrize("how, expected", [("default", "current"), ("flag", "legacy"), ("env", "legacy"),
                                           ("toml", "legacy"), ("flag-over-env", "current")])
def test_up_and_server_hand_the_switch_to_the_api(command, how, expected, tmp_path, monkeypatch):
    args, env, before = [], {}, ()
    if how == "flag":
        args = ["--metrics-dcgm-names", "legacy"]
    elif how == "env":
        env = {"TRIMTAB_METRICS_DCGM_NAMES": "legacy"}
    elif how == "toml":
        config = tmp_path / "trimtab.toml"
        config.write_text('metrics_dcgm_names = "legacy"\n')
        before = ("--config", str(config))
    elif how == "flag-over-env":
        args, env = ["--metrics-dcgm-names", "current"], {"TRIMTAB_METRICS_DCGM_NAMES": "legacy"}
    result, built = _built(command, args, tmp_path, monkeypatch, env, before)
    assert isinstance(result.exception, Served), result.output
    assert [ctx.metrics_dcgm_names for ctx in built] == [expected]


def test_a_value_that_is_no_generation_is_refused_naming_the_choices(tmp_path, monkeypatch):
    result, built = _built("server", ["--metrics-dcgm-names", "newest"], tmp_path, monkeypatch, {})
    assert result.exit_code == 2 and built == []
    assert "'newest' is not one of 'current', 'legacy'" in result.output


def _names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_")}


def test_the_served_metrics_follow_the_switch(make_api):
    got = {}
    for generation in ("current", "legacy"):
        api = make_api("sqlite", metrics_dcgm_names=generation)
        Sampler([SimulatedNode(2, "balanced", hostname="sim-names")], api.ctx.snapshot.update,
                hostname="sim-names").tick()
        text = api.http.get("/metrics").text
        got[generation] = _names(text)
        assert ('Hostname="sim-names"' in text) == (generation == "legacy"), generation
    assert {"DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_FB_USED_BYTES",
            "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"} <= got["current"]
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PCIE_TX_BYTES"} <= got["legacy"]
    assert not got["current"] & got["legacy"]  # no name is in both
