"""One grading engine: a rule that exists only in a rules file is a row of `trimtab check`, GET /v1/balance and
/metrics alike, with the same grade and value for the same window as the controller's reading of it."""

import json
import textwrap
import time

import httpx
import pytest
from click.testing import CliRunner

from tests.api.conftest import ServedApp
from tests.api.metrics.conftest import Feeder, scrape
from trimtab.api.app import create_app
from trimtab.api.context import ApiContext
from trimtab.cli.main import cli
from trimtab.contract.statuses import SEVERITY
from trimtab.grading.grading import job_checks, node_rules
from trimtab.grading.rules import load_rules
from trimtab.grading.rules_parse import RulesError
from trimtab.grading.signals import gpu_reading
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate
from trimtab.store.queries import gpu_aggregates

WATERMARK = """\
    [rules.memory_watermark]
    # a site's own line, far below the shipped memory rule's
    priority = 25
    scope = "gpu"
    signal = "mem_used_pct"
    unit = "%"
    healthy_below = 1.0
    act_above = 2.0
    actions = []
    advice = "GPU memory is above this site's watermark."
    """


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text(textwrap.dedent(WATERMARK))
    return path


def test_a_rule_only_in_a_rules_file_is_graded_alike_by_check_the_api_and_metrics(tmp_path, rules_file):
    db = f"sqlite:///{tmp_path}/t.db"
    engine = open_engine(db)
    migrate(engine)
    rules = load_rules(rules_file)
    ctx = ApiContext(engine=engine, mode="server", state_dir=tmp_path, rules=rules)
    try:
        Feeder(ctx).simulated(hostname="sim-a", scenario="balanced", n_gpus=4, ticks=4)

        shipped = CliRunner().invoke(cli, ["check", "--db", db, "--window", "30", "--json"])
        assert shipped.exit_code == 0, shipped.output  # a balanced node, by the shipped rules
        assert "memory_watermark" not in shipped.stdout
        res = CliRunner().invoke(cli, ["check", "--db", db, "--window", "30", "--rules-file", str(rules_file),
                                       "--json"])
        assert res.exit_code == 1, res.output  # the file's own rule acts
        by_check = {v["check"]: v for v in json.loads(res.stdout)["nodes"][0]["verdicts"]}

        with ServedApp(create_app(ctx)) as served:
            body = httpx.get(f"{served.url}/v1/balance", params={"window_s": 30}).json()
        by_api = {v["check"]: v for v in body["reports"][0]["verdicts"]}

        got = scrape(ctx)
        status = {lab["check"]: v for lab, v in got["trimtab_balance_status"]}
        value = {lab["check"]: v for lab, v in got["trimtab_balance_value"]}

        row, api_row = by_check["memory_watermark"], by_api["memory_watermark"]
        assert (row["status"], row["healthy_below"], row["act_above"], row["unit"]) == ("act", 1.0, 2.0, "%")
        assert row["advice"] == "GPU memory is above this site's watermark."
        for name in [r.name for r in node_rules(rules)]:  # every node row, the new one and the shipped ones
            assert by_api[name]["status"] == by_check[name]["status"], name
            assert status[name] == SEVERITY[by_check[name]["status"]], name
            if by_check[name]["value"] is not None:
                assert by_api[name]["value"] == pytest.approx(by_check[name]["value"], rel=1e-9), name
                assert value[name] == pytest.approx(by_check[name]["value"], rel=1e-9), name
        assert api_row["message"] == row["message"] and api_row["gpu_index"] == row["gpu_index"]

        # … and the controller's reading of the same GPUs over the same window says the same.
        now = int(time.time() * 1000)
        reading = gpu_reading(rules["memory_watermark"], gpu_aggregates(engine, now - 30_000, now), min_samples=1)
        assert (reading.status, reading.value) == ("act", pytest.approx(row["value"], rel=1e-9))
        assert reading.detail["gpu"] == row["gpu_index"]
    finally:
        engine.dispose()


def test_the_node_rows_follow_the_rules_not_a_list_of_names(rules_file):
    shipped, site = load_rules(), load_rules(rules_file)
    assert [r.name for r in node_rules(shipped)] == ["utilization_spread", "pcie", "memory"]
    assert [r.name for r in node_rules(site)] == ["utilization_spread", "pcie", "memory_watermark", "memory"]


def test_a_new_job_rule_is_a_job_row_and_a_new_phase_rule_joins_step_composition(tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text(textwrap.dedent("""\
        [rules.fragmentation_severe]
        priority = 35
        scope = "job"
        signal = "fragmentation_pct"
        unit = "%"
        healthy_below = 40.0
        act_above = 60.0
        actions = []
        advice = "Fragmentation is severe."

        [rules.checkpoint_bound]
        priority = 85
        scope = "job"
        signal = "evaluation_share_pct"
        unit = "% of step"
        healthy_below = 60.0
        act_above = 80.0
        actions = []
        advice = "Scoring dominates."
        """))
    assert job_checks(load_rules()) == ["step_composition", "fragmentation", "collective_latency"]
    assert job_checks(load_rules(path)) == ["step_composition", "fragmentation", "fragmentation_severe",
                                            "collective_latency"]


def test_a_table_without_a_scope_is_still_a_typo_of_a_shipped_rule(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text("[rules.memroy]\nact_above = 97.0\n")
    with pytest.raises(RulesError, match="unknown rule 'memroy'"):
        load_rules(path)
