"""The expander the query tests rely on reproduces Grafana's documented expansions (PostgreSQL data source, "Macros";
Variables, "Global variables" and "Advanced variable format options"), and refuses what Grafana refuses."""

from __future__ import annotations

import pytest

from .grafana_expand import (ALL, MacroError, TimeRange, Variable, epoch_to_ms, expand_postgres_macros,
                             expand_promql, expand_sql, format_interval, interval_for, interpolate_variables,
                             referenced_variables)

# The documentation's examples use 2017-04-21T05:01:17Z .. 05:06:17Z (1492750877 .. 1492751177).
TR = TimeRange(1492750877_000, 1492751177_000)


@pytest.mark.parametrize("macro, expanded", [
    ("$__time(dateColumn)", 'dateColumn AS "time"'),
    ("$__timeEpoch(dateColumn)", 'extract(epoch from dateColumn) as "time"'),
    ("$__timeFilter(dateColumn)", "dateColumn BETWEEN '2017-04-21T05:01:17Z' AND '2017-04-21T05:06:17Z'"),
    ("$__timeFrom()", "'2017-04-21T05:01:17Z'"),
    ("$__timeTo()", "'2017-04-21T05:06:17Z'"),
    ("$__timeGroup(dateColumn,'5m')", "floor(extract(epoch from dateColumn)/300)*300"),
    ("$__timeGroupAlias(dateColumn,'5m')", 'floor(extract(epoch from dateColumn)/300)*300 AS "time"'),
    ("$__unixEpochFilter(dateColumn)", "dateColumn >= 1492750877 AND dateColumn <= 1492751177"),
    ("$__unixEpochNanoFilter(dateColumn)",
     "dateColumn >= 1492750877000000000 AND dateColumn <= 1492751177000000000"),
    ("$__unixEpochNanoFrom()", "1492750877000000000"),
    ("$__unixEpochGroup(dateColumn,'5m')", "floor((dateColumn)/300)*300"),
    ("$__unixEpochGroupAlias(dateColumn,'5m')", 'floor((dateColumn)/300)*300 AS "time"'),
    ("$__unixEpochGroupAlias(ts_ms / 1000.0, 500ms)", 'floor((ts_ms / 1000.0)/0.5)*0.5 AS "time"'),
    ("$__unixEpochGroupAlias(t, 2w)", 'floor((t)/1.2096e+06)*1.2096e+06 AS "time"'),
])
def test_postgres_macros_expand_as_documented(macro, expanded):
    assert expand_postgres_macros(macro, TR) == expanded


def test_backend_globals_and_comments():
    sql = "SELECT $__unixEpochFrom(), $__unixEpochTo(), '$__interval', $__interval_ms -- $__nope(x)\n/* $__nope() */"
    assert expand_sql(sql, {}, TR, 60_000).split() == ["SELECT", "1492750877,", "1492751177,", "'1m',", "60000"]
    assert expand_sql("WHERE '--' = '--' AND $__timeFrom() IS NOT NULL", {}, TR, 1000) == \
        "WHERE '--' = '--' AND '2017-04-21T05:01:17Z' IS NOT NULL"


def test_unknown_macros_and_bad_intervals_fail_as_in_grafana():
    with pytest.raises(MacroError, match="unknown macro"):
        expand_postgres_macros("SELECT $__timeFiltr(t)", TR)
    with pytest.raises(MacroError, match="interval"):
        expand_postgres_macros("SELECT $__unixEpochGroup(t, soon)", TR)
    with pytest.raises(MacroError, match="needs time column"):
        expand_postgres_macros("SELECT $__unixEpochGroup(t)", TR)


def test_sql_variables_are_quoted_as_the_sql_datasources_do():
    host = Variable("host", multi=True, include_all=True, options=["a", "b'c"])
    job_all = Variable("job", include_all=True, all_value="__all", options=["x"])
    single = Variable("job1", options=["ppo"], current="ppo")
    vars_ = {"host": host, "job": job_all, "job1": single}
    text = "IN ($host) '${job:raw}' '$job1' [[job1]] ${job1} $__from-$__to $unknown $__timeFilter(t)"
    assert interpolate_variables(text, vars_, TR, 1000, "sql") == (
        "IN ('a','b''c') '__all' 'ppo' ppo ppo 1492750877000-1492751177000 $unknown $__timeFilter(t)")
    host.current = "b'c"  # one value of a multi-value variable is still quoted
    job_all.current = "x"
    assert interpolate_variables("$host ${job:raw} $job", vars_, TR, 1000, "sql") == "'b''c' x 'x'"


def test_prometheus_variables_are_regex_escaped():
    host = Variable("host", multi=True, include_all=True, all_value=".*", options=["n.1", "n2"])
    vars_ = {"host": host}
    assert expand_promql('up{h=~"$host"}', vars_, TR, 1000) == 'up{h=~".*"}'
    host.current = ["n.1", "n2"]
    assert expand_promql('up{h=~"$host"}', vars_, TR, 1000) == 'up{h=~"(n\\\\.1|n2)"}'
    host.current = ["n2"]
    assert expand_promql('up{h=~"$host"}', vars_, TR, 1000) == 'up{h=~"n2"}'


def test_references_skip_macros():
    assert referenced_variables("$__unixEpochGroupAlias(x, $__interval) $a ${b:raw} [[c]] $__from") == \
        ["__interval", "a", "b", "c", "__from"]


def test_intervals_and_time_columns():
    assert interval_for(TimeRange(0, 15 * 60_000)) == 1000  # 900 ms rounds to 1 s
    assert interval_for(TimeRange(0, 6 * 3_600_000)) == 20_000
    assert interval_for(TimeRange(0, 4 * 86_400_000)) == 300_000
    assert [format_interval(ms) for ms in (500, 1000, 20_000, 300_000, 3_600_000, 86_400_000)] == \
        ["500ms", "1s", "20s", "5m", "1h", "1d"]
    assert epoch_to_ms(1_700_000_000) == 1_700_000_000_000  # seconds
    assert epoch_to_ms(1_700_000_000_123) == 1_700_000_000_123  # already ms
    assert epoch_to_ms(1_700_000_000_000_000_000) == 1_700_000_000_000  # ns
    assert ALL == "$__all"
