"""The rules file: the shipped rules, overrides from a file / trimtab.toml / a job, and every way a bad file is
rejected with its line and reason."""

from __future__ import annotations

import re
import textwrap

import pytest

from trimtab.grading.rule_types import Action
from trimtab.grading.rules import RuleSet, load_rules, thresholds
from trimtab.grading.rules_parse import RulesError

SHIPPED_ORDER = ["oom", "memory", "memory_forecast", "fragmentation", "collective_latency", "pcie", "communication_bound",
                 "generation_bound", "rollout_wait_bound", "evaluation_bound", "utilization_spread",
                 "update_bound"]


def write(tmp_path, body: str):
    path = tmp_path / "rules.toml"
    path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    return path


def reject(tmp_path, body: str) -> str:
    path = write(tmp_path, body)
    with pytest.raises(RulesError) as err:
        load_rules(path)
    message = str(err.value)
    assert message.startswith(str(path)), message  # the error names the file
    return message


def line_of(message: str) -> int:
    m = re.search(r"\(line (\d+)\)", message) or re.search(r"at line (\d+)", message)
    assert m, f"no line number in {message!r}"
    return int(m.group(1))


# -- the shipped rules ------------------------------------------------------------------------------------------

def test_shipped_rules_load_sorted_by_priority_with_their_actions():
    rs = load_rules()
    assert rs.names() == SHIPPED_ORDER
    priorities = [r.priority for r in rs.rules]
    assert priorities == sorted(priorities) == [10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95]
    assert [r.name for r in rs.rules if r.safety] == ["oom", "memory", "memory_forecast", "fragmentation"]
    gen = rs["generation_bound"]
    assert gen.actions == (Action("batch_size", "mul", 4.0, needs_memory_headroom=True),
                           Action("prefetch", "add", 2.0))
    assert (gen.healthy_below, gen.act_above) == (45.0, 50.0)
    assert rs["pcie"].actions == (Action("prefetch", "add", -1.0),)
    assert rs["pcie"].actions[0].direction == -1 and gen.actions[0].direction == 1
    assert rs["memory"].actions[0] == Action("batch_size", "div", 2.0)
    assert [a.knob for a in rs["memory"].actions[1:]] == ["actor_update_micro_batch", "log_prob_micro_batch",
                                                         "ref_log_prob_micro_batch", "actor_update_max_tokens",
                                                         "log_prob_max_tokens", "ref_log_prob_max_tokens",
                                                         "critic_max_tokens", "critic_values_max_tokens"]
    # verl's token budgets (dynamic batching) move as its micro-batches do, in every rule that moves those
    for rule in ("memory", "fragmentation", "evaluation_bound", "update_bound"):
        micro = {(a.op, a.by, a.needs_memory_headroom) for a in rs[rule].actions if a.knob.endswith("_micro_batch")}
        tokens = {(a.op, a.by, a.needs_memory_headroom) for a in rs[rule].actions if a.knob.endswith("_max_tokens")}
        assert micro and tokens == micro, rule
    assert rs["communication_bound"].actions == (Action("sync_every", "mul", 2.0, strong_by=4.0),)
    assert rs["communication_bound"].strong_above == 40.0
    assert rs["oom"].actions == ()
    ctl = rs.controller
    assert (ctl.window_min_steps, ctl.window_min_s, ctl.settle_steps, ctl.dead_band_pct, ctl.retry_after_s) == \
        (1, 4.0, 1, 2.0, 600.0)
    assert isinstance(ctl.window_min_steps, int) and isinstance(ctl.window_min_s, float)


def test_thresholds_match_the_old_check_thresholds():
    t = thresholds(load_rules())
    assert set(t) == {"utilization_spread", "pcie", "memory"}
    spread = t["utilization_spread"]
    assert (spread["signal"], spread["fallback_signal"]) == ("sm_active_pct", "util_pct")
    assert (spread["healthy_below"], spread["act_above"]) == (25.0, 40.0)
    assert (t["pcie"]["healthy_below"], t["pcie"]["act_above"]) == (70.0, 90.0)
    assert (t["memory"]["healthy_below"], t["memory"]["act_above"]) == (90.0, 98.0)
    assert "PCIe is saturated" in t["pcie"]["advice"]


def test_rule_grade_ok_watch_act():
    pcie = load_rules()["pcie"]
    assert [pcie.grade(v) for v in (69.9, 70.0, 90.0, 90.1)] == ["ok", "watch", "watch", "act"]


# -- overriding ---------------------------------------------------------------------------------------------------

def test_a_file_overriding_one_value_changes_only_that(tmp_path):
    shipped = load_rules()
    rs = load_rules(write(tmp_path, """
        [rules.pcie]
        act_above = 95.0
        """))
    assert rs["pcie"].act_above == 95.0
    assert rs["pcie"].healthy_below == 70.0 and rs["pcie"].actions == shipped["pcie"].actions
    assert rs.controller == shipped.controller
    assert [r for r in rs.rules if r.name != "pcie"] == [r for r in shipped.rules if r.name != "pcie"]


def test_a_file_overriding_a_controller_value_and_priority_reorders(tmp_path):
    rs = load_rules(write(tmp_path, """
        [controller]
        dead_band_pct = 5

        [rules.evaluation_bound]
        priority = 65
        """))
    assert rs.controller.dead_band_pct == 5.0 and rs.controller.retry_after_s == 600.0
    assert rs.names()[6:9] == ["communication_bound", "evaluation_bound", "generation_bound"]


def test_trimtab_toml_overrides_apply_after_the_file(tmp_path):
    path = write(tmp_path, """
        [rules.memory]
        act_above = 97.0
        """)
    rs = load_rules(path, overrides={"controller": {"settle_steps": 2}, "rules": {"memory": {"healthy_below": 80.0}}})
    assert (rs["memory"].healthy_below, rs["memory"].act_above, rs.controller.settle_steps) == (80.0, 97.0, 2)
    with pytest.raises(RulesError, match=r"^trimtab\.toml: unknown rule 'memroy'"):
        load_rules(overrides={"rules": {"memroy": {"act_above": 1.0}}})


def test_with_overrides_rules_shape_and_bare_shape_give_the_same_set():
    base = load_rules()
    a = base.with_overrides({"rules": {"generation_bound": {"act_above": 60.0}}, "controller": {"settle_steps": 3}})
    b = base.with_overrides({"generation_bound": {"act_above": 60.0}})
    assert a["generation_bound"].act_above == b["generation_bound"].act_above == 60.0
    assert a.controller.settle_steps == 3 and b.controller.settle_steps == 1
    assert b.rules == tuple(r if r.name != "generation_bound" else b["generation_bound"] for r in base.rules)
    assert base["generation_bound"].act_above == 50.0  # the original is untouched
    assert base.with_overrides(None) is base and base.with_overrides({}) is base


def test_with_overrides_can_replace_an_action_list():
    rs = load_rules().with_overrides({"pcie": {"actions": [{"knob": "prefetch", "op": "div", "by": 2}]}})
    assert rs["pcie"].actions == (Action("prefetch", "div", 2.0),)


@pytest.mark.parametrize("overrides, words", [
    (["pcie"], "overrides must be a table, got list"),
    ("pcie", "overrides must be a table, got str"),
    ({"rules": ["pcie"]}, "rules must be a table, got list"),
    ({"pcie": 5}, "rules.pcie must be a table"),
    ({"rules": {}, "knobs": {}}, "unknown top-level keys ['knobs']"),
    ({"nope": {"act_above": 1.0}}, "unknown rule 'nope'"),
    ({"pcie": {"act_abov": 1.0}}, "rule 'pcie' has no key 'act_abov'"),
    ({"pcie": {"act_above": "high"}}, "rules.pcie.act_above: expected a number, got 'high'"),
    ({"pcie": {"healthy_below": 95.0}}, "healthy_below (95.0) is above act_above (90.0)"),
])
def test_with_overrides_rejects_bad_job_rules(overrides, words):
    with pytest.raises(RulesError) as err:
        load_rules().with_overrides(overrides, source="job j1 rules")
    assert words in str(err.value)


# -- bad files: line and reason -------------------------------------------------------------------------------------

def test_toml_syntax_error_names_the_line(tmp_path):
    msg = reject(tmp_path, """
        [rules.pcie]
        act_above = 95.0
        healthy_below 70
        """)
    assert line_of(msg) == 3


def test_unknown_rule_names_its_table_line(tmp_path):
    msg = reject(tmp_path, """
        [controller]
        settle_steps = 1

        [rules.pcie_bw]
        act_above = 95.0
        """)
    assert "unknown rule 'pcie_bw'" in msg and line_of(msg) == 4


def test_unknown_key_names_the_line_of_that_key(tmp_path):
    msg = reject(tmp_path, """
        [rules.pcie]
        act_above = 95.0

        [rules.memory]
        healthy_below = 90.0
        act_abve = 99.0
        """)
    assert "rule 'memory' has no key 'act_abve'" in msg and line_of(msg) == 6


def test_unknown_controller_key_names_its_line(tmp_path):
    msg = reject(tmp_path, """
        [controller]
        dead_band_pct = 3.0
        dead_band = 3.0
        """)
    assert "[controller] has no key 'dead_band'" in msg and line_of(msg) == 3


def test_healthy_above_act_is_rejected_at_the_healthy_below_line(tmp_path):
    msg = reject(tmp_path, """
        [rules.fragmentation]
        act_above = 20.0
        healthy_below = 30.0
        """)
    assert "healthy_below (30.0) is above act_above (20.0)" in msg and line_of(msg) == 3


def test_unknown_op_is_rejected(tmp_path):
    msg = reject(tmp_path, """
        [rules.pcie]
        healthy_below = 70.0
        actions = [{ knob = "prefetch", op = "sub", by = 1 }]
        """)
    assert "rules.pcie.actions[0]: op must be one of ('mul', 'div', 'add'), got 'sub'" in msg and line_of(msg) == 3


@pytest.mark.parametrize("action", [
    '{ knob = "batch_size", op = "mul", by = 1 }',
    '{ knob = "batch_size", op = "div", by = 1.0 }',
    '{ knob = "prefetch", op = "add", by = 0 }',
    '{ knob = "batch_size", op = "div", by = 0 }',
    '{ knob = "batch_size", op = "mul", by = -2 }',
])
def test_a_by_that_does_not_change_the_knob_is_rejected(tmp_path, action):
    msg = reject(tmp_path, f"""
        [rules.memory]
        # a comment line
        actions = [{action}]
        """)
    assert "rules.memory.actions[0]: by=" in msg and "would not change the knob" in msg and line_of(msg) == 3


@pytest.mark.parametrize("key, value, words", [
    ("act_above", '"high"', "rules.pcie.act_above: expected a number, got 'high'"),
    ("act_above", "true", "rules.pcie.act_above: expected a number, got True"),
    ("priority", "5.5", "rules.pcie.priority: expected a whole number, got 5.5"),
    ("safety", '"yes"', "rules.pcie.safety: must be true or false"),
    ("advice", "42", "rules.pcie.advice: must be text"),
    ("actions", '"prefetch"', "rules.pcie.actions: must be a list"),
    ("scope", '"node"', "rules.pcie.scope: must be one of ('job', 'gpu'), got 'node'"),
    ("signal", '"pcie_pct"', "rules.pcie.signal: unknown signal 'pcie_pct'"),
])
def test_wrong_type_is_rejected_at_its_line(tmp_path, key, value, words):
    msg = reject(tmp_path, f"""
        [rules.pcie]
        unit = "%"
        {key} = {value}
        """)
    assert words in msg and line_of(msg) == 3


def test_wrong_controller_type_is_rejected_at_its_line(tmp_path):
    msg = reject(tmp_path, """
        [controller]
        settle_steps = 1
        window_min_steps = 1.5
        """)
    assert "controller.window_min_steps: expected a whole number, got 1.5" in msg and line_of(msg) == 3


def test_action_with_an_extra_key_is_rejected(tmp_path):
    msg = reject(tmp_path, """
        [rules.pcie]
        actions = [{ knob = "prefetch", op = "add", by = -1, step = 2 }]
        """)
    assert "rules.pcie.actions[0]: needs exactly knob, op, by" in msg and line_of(msg) == 2


def test_missing_file_is_a_rules_error(tmp_path):
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "nope.toml")


def test_ruleset_lookup_of_an_unknown_rule_is_a_key_error():
    rs: RuleSet = load_rules()
    with pytest.raises(KeyError):
        rs["nope"]
