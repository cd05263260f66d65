"""Every SQL query of the dashboards (panel targets, annotations, variables), expanded as Grafana expands it, runs
against a real PostgreSQL holding a simulated run, connected to exactly as the provisioned datasource says, and
returns rows in the shape its panel needs: time series a ``time`` column (epoch inside the range, ascending), an
optional ``metric`` string and numeric value columns; tables exactly the columns the panel pins.

Each query runs for three time ranges (raw samples, 1-minute and 1-hour rollups) and several variable selections.
PostgreSQL comes from TRIMTAB_TEST_PG_URL (default: the local server); the test makes a database of its own and
drops it. Unreachable: skipped, saying why — unless TRIMTAB_REQUIRE_PG=1, where that fails.
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Optional

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate

from . import simrun
from .dashboards import (all_panels, datasources, env_for_tests, load_dashboards, organize_columns, override_names,
                         pg_connect_kwargs, queries)
from .grafana_expand import ALL, TimeRange, Variable, epoch_to_ms, expand_sql, interval_for

pytestmark = pytest.mark.postgres

DASHES = {n: d for n, d in load_dashboards().items() if not n.endswith("-prometheus.json")}
RANGES = {"raw": 15 * 60_000, "1m-rollup": 6 * 3_600_000, "1h-rollup": 4 * 86_400_000}


@dataclass
class Store:
    conn: Any  # psycopg connection made from the provisioned datasource
    url: str  # SQLAlchemy URL of the same database (for trimtab's own queries)
    now_ms: int
    job_ids: dict[str, int]

    def run(self, sql: str) -> tuple[list[str], list[tuple]]:
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return [d.name for d in cur.description], cur.fetchall()

    def range(self, name: str) -> TimeRange:
        return TimeRange(self.now_ms - RANGES[name], self.now_ms)


@pytest.fixture(scope="module")
def store():
    from tests.store.conftest import pg_admin_or_skip

    import psycopg

    base, admin = pg_admin_or_skip()
    db = f"trimtab_grafana_{secrets.token_hex(4)}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    url = make_url(base).set(database=db)
    try:
        engine = open_engine(url.render_as_string(hide_password=False))
        now_ms = int(time.time() * 1000)
        migrate(engine)
        simrun.populate(engine, now_ms)
        with engine.connect() as c:
            job_ids = dict(c.execute(text("SELECT name, id FROM jobs")).all())
        engine.dispose()
        # Connect the way Grafana would: the provisioned datasource, its variables pointing at this database.
        env = env_for_tests(TRIMTAB_PG_HOST=url.host or "127.0.0.1", TRIMTAB_PG_PORT=str(url.port or 5432),
                            TRIMTAB_PG_DATABASE=db, TRIMTAB_PG_USER=url.username or "postgres",
                            TRIMTAB_PG_PASSWORD=url.password or "")
        kwargs = pg_connect_kwargs(datasources(env)["trimtab-postgres"])
        conn = psycopg.connect(**kwargs, autocommit=True, connect_timeout=5,
                               options="-c default_transaction_read_only=on")  # a reader role cannot write
        try:
            yield Store(conn, url.render_as_string(hide_password=False), now_ms, job_ids)
        finally:
            conn.close()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


def resolve_variables(store: Store, dash: dict, tr: TimeRange, interval_ms: int,
                      picks: Optional[dict[str, Any]] = None) -> dict[str, Variable]:
    """Run the dashboard's variable queries in order, as Grafana does on load; pick ``picks`` (default: All where
    the variable has it, else its first option). Every variable query must return options."""
    picks = picks or {}
    out: dict[str, Variable] = {}
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        cols, rows = store.run(expand_sql(v["query"], out, tr, interval_ms))
        assert rows, f"variable {v['name']} has no options"
        if "__value" in cols:
            assert "__text" in cols, cols
            values = [str(r[cols.index("__value")]) for r in rows]
        else:
            assert len(cols) == 1, f"variable {v['name']}: one column or __text/__value, not {cols}"
            values = [str(r[0]) for r in rows]
        pick = picks.get(v["name"], ALL if v.get("includeAll") else values[0])
        out[v["name"]] = Variable.from_json(v, values, pick)
    return out


NUMBER = (int, float, Decimal)


def check_result(where: str, fmt: str, panel: Optional[dict], cols: list[str], rows: list[tuple], tr: TimeRange,
                 interval_ms: int) -> None:
    assert rows, f"{where}: no rows"
    assert len(set(cols)) == len(cols), f"{where}: duplicate columns {cols}"
    if fmt in ("time_series", "annotation"):
        assert "time" in cols, f"{where}: no time column in {cols}"
        ti = cols.index("time")
        times = [epoch_to_ms(r[ti]) for r in rows]
        assert all(tr.from_ms - interval_ms <= t <= tr.to_ms for t in times), \
            f"{where}: times outside the range (a unit error?): {times[:3]}…"
        assert times == sorted(times), f"{where}: rows not sorted by time"
    if fmt == "annotation":
        assert "text" in cols, cols
        return
    if fmt == "time_series":
        values = [c for c in cols if c not in ("time", "metric")]
        assert values, f"{where}: no value column"
        if "metric" in cols:
            mi = cols.index("metric")
            assert all(isinstance(r[mi], str) for r in rows), f"{where}: metric must be a string"
        for c in values:
            i = cols.index(c)
            assert all(r[i] is None or isinstance(r[i], NUMBER) for r in rows), f"{where}: {c} is not numeric"
            assert any(r[i] is not None for r in rows), f"{where}: {c} is NULL in every row"
    elif fmt == "table":
        pinned = organize_columns(panel)
        assert pinned is not None, f"{where}: table without pinned columns"
        assert cols == pinned, f"{where}: columns {cols} but the panel pins {pinned}"


def _scenarios(name: str, store: Store) -> dict[str, dict]:
    if name in ("job.json", "rebalancer.json"):
        return {"job": {"job": simrun.JOB}}
    return {"all": {}, "job": {"job": simrun.JOB}, "one-host": {"host": simrun.HOST_B}}


@pytest.mark.parametrize("resolution", sorted(RANGES))
@pytest.mark.parametrize("name", sorted(DASHES))
def test_every_sql_query_returns_what_its_panel_needs(store: Store, name: str, resolution: str):
    dash = DASHES[name]
    tr = store.range(resolution)
    interval_ms = interval_for(tr, min_interval=datasources()["trimtab-postgres"]["jsonData"]["timeInterval"])
    ran = 0
    for scenario, picks in _scenarios(name, store).items():
        variables = resolve_variables(store, dash, tr, interval_ms, picks)
        for q in queries(name, dash):
            if q.fmt == "variable":
                continue  # run by resolve_variables
            sql = expand_sql(q.text, variables, tr, interval_ms)
            where = f"{name} [{resolution}, {scenario}] {q.where}"
            try:
                cols, rows = store.run(sql)
            except Exception as exc:  # noqa: BLE001 - report the query with the error
                pytest.fail(f"{where}: {exc}\n{sql}")
            check_result(where, q.fmt, q.panel, cols, rows, tr, interval_ms)
            if q.panel is not None:
                names = {c for c in cols if c not in ("time", "metric")}
                ran += 1
                _columns_of_panel.setdefault((name, q.panel["title"]), set()).update(names)
    assert ran
    # Overrides by name must name a column some target of the panel returns.
    for panel in all_panels(dash):
        got = _columns_of_panel.get((name, panel.get("title")), set())
        for o in override_names(panel):
            assert o in got, f"{name} {panel['title']!r}: override for {o!r}, columns are {sorted(got)}"


_columns_of_panel: dict[tuple[str, str], set[str]] = {}


# -- what the numbers mean -------------------------------------------------------------------------------------


def _panel(name: str, title_start: str) -> dict:
    panels = list(all_panels(DASHES[name]))
    found = [p for p in panels if p["title"] == title_start] or [p for p in panels if p["title"].startswith(title_start)]
    assert len(found) == 1, (title_start, [p["title"] for p in all_panels(DASHES[name])])
    return found[0]


def _run_panel(store: Store, name: str, title_start: str, resolution: str = "raw", picks=None,
               ref: str = "A") -> list[dict]:
    tr = store.range(resolution)
    interval_ms = interval_for(tr, min_interval="1s")
    variables = resolve_variables(store, DASHES[name], tr, interval_ms, picks)
    target = next(t for t in _panel(name, title_start)["targets"] if t["refId"] == ref)
    cols, rows = store.run(expand_sql(target["rawSql"], variables, tr, interval_ms))
    return [dict(zip(cols, r)) for r in rows]


def test_the_gpu_variable_follows_host_and_job(store: Store):
    tr = store.range("raw")
    dash = DASHES["balance.json"]
    gpus = {k: resolve_variables(store, dash, tr, 1000, picks)["gpu"].options for k, picks in
            {"all": {}, "job": {"job": simrun.JOB}, "host": {"host": simrun.HOST_B},
             "other job": {"job": simrun.OTHER_JOB}}.items()}
    assert len(gpus["all"]) == 6
    assert gpus["job"] == [f"GPU-sim-{simrun.HOST_A}-{i}" for i in range(4)]  # ppo-demo: sim-a GPUs 0-3
    assert gpus["host"] == [f"GPU-sim-{simrun.HOST_B}-{i}" for i in range(2)]
    assert gpus["other job"] == [f"GPU-sim-{simrun.HOST_B}-{i}" for i in range(2)]


BARE = f"{simrun.HOST_B} GPU {simrun.BARE_GPU} (simulated)"


@pytest.mark.parametrize("resolution", sorted(RANGES))
def test_unsupported_nvlink_and_gpm_are_absent_or_null_never_zero(store: Store, resolution: str):
    for ref in ("A", "B"):
        series = {r["metric"] for r in _run_panel(store, "interconnect.json", "NVLink TX / RX", resolution, ref=ref)}
        assert len(series) == 5 and not any(m.startswith(BARE) for m in series), series
    sm = {r["metric"] for r in _run_panel(store, "balance.json", "SM activity", resolution)}
    assert BARE not in sm and len(sm) == 5
    links = {(r["host"], r["gpu"]): r for r in _run_panel(store, "interconnect.json", "Links per GPU", resolution)}
    assert len(links) == 6
    bare = links[(simrun.HOST_B, simrun.BARE_GPU)]
    assert bare["NVLink links"] is None and bare["NVLink TX"] is None and bare["NVLink RX"] is None
    assert bare["PCIe TX"] > 0 and bare["PCIe link"] == "Gen5 x16"
    others = [r for k, r in links.items() if k != (simrun.HOST_B, simrun.BARE_GPU)]
    assert all(r["NVLink links"] == 18 and r["NVLink TX"] > 0 for r in others)


def test_rollup_ranges_read_the_rollups(store: Store):
    raw = _run_panel(store, "balance.json", "Utilization per GPU", "raw")
    minute = _run_panel(store, "balance.json", "Utilization per GPU", "1m-rollup")
    hour = _run_panel(store, "balance.json", "Utilization per GPU", "1h-rollup")
    assert any(epoch_to_ms(r["time"]) % 60_000 for r in raw)  # raw samples sit between minutes
    assert all(epoch_to_ms(r["time"]) % 60_000 == 0 for r in minute) and len(minute) > 6 * 40
    assert all(epoch_to_ms(r["time"]) % 3_600_000 == 0 for r in hour)
    # The hour means are the means of every sample of that hour that the rollup has seen (complete minutes).
    rolled_up_to = store.now_ms - store.now_ms % 60_000
    cols, rows = store.run(
        "SELECT g.uuid, s.ts_ms - s.ts_ms % 3600000 AS h, avg(s.util_pct) FROM gpu_samples s JOIN gpus g ON g.id ="
        " s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.hostname = 'sim-a' AND g.gpu_index = 0"
        f" AND s.ts_ms < {rolled_up_to} GROUP BY 1, 2")
    expected = {h: float(v) for _, h, v in rows}
    got = {epoch_to_ms(r["time"]): float(r["utilization"]) for r in hour if r["metric"].startswith("sim-a GPU 0 ")}
    assert got.keys() == expected.keys()
    for h in got:
        assert got[h] == pytest.approx(expected[h], rel=1e-9)


def test_verdicts_match_trimtab_check(store: Store):
    from trimtab.grading.node_report import node_reports

    rows = _run_panel(store, "balance.json", "Verdict per threshold")
    engine = open_engine(store.url)
    try:
        reports = {r.hostname: r for r in node_reports(engine, 30, now_ms=store.now_ms)}
    finally:
        engine.dispose()
    assert {r["host"] for r in rows} == set(reports) == {simrun.HOST_A, simrun.HOST_B}
    for r in rows:
        verdict = next(v for v in reports[r["host"]].verdicts if v.check == r["check"])
        assert r["value"] == pytest.approx(verdict.value, abs=0.051), (r, verdict)
        assert r["status"] == verdict.status, (r, verdict)
    assert next(r for r in rows if r["host"] == simrun.HOST_A and r["check"] == "utilization_spread")["status"] == "act"


def test_job_panels_fold_ranks_into_steps(store: Store):
    steps = {}  # step → (slowest rank's time, samples summed): as simrun wrote them
    for step in range(120):
        ranks = [simrun.report(0, step, rank, 0, "h", latency=None, ooms=0) for rank in range(2)]
        steps[step] = (max(r["step_time_s"] for r in ranks), sum(r["samples"] for r in ranks))
    stat = _run_panel(store, "job.json", "Step-time variation", "1h-rollup", {"job": simrun.JOB})
    assert stat[0]["steps"] == 120
    assert stat[0]["mean step time"] == pytest.approx(statistics.mean(t for t, _ in steps.values()))
    times = [t for t, _ in steps.values()]
    assert stat[0]["step-time variation"] == pytest.approx(100 * statistics.stdev(times) / statistics.mean(times))
    # With one bucket over the whole run (a 1000-week interval), throughput is samples over all steps' time.
    tr = TimeRange(store.now_ms - 41 * 60_000, store.now_ms)
    sql = next(t for t in _panel("job.json", "Throughput")["targets"])["rawSql"]
    variables = resolve_variables(store, DASHES["job.json"], tr, 1000, {"job": simrun.JOB})
    cols, rows = store.run(expand_sql(sql.replace("$__interval", "1000w"), variables, tr, 1000))
    assert len(rows) == 1
    assert rows[0][cols.index("samples/s")] == pytest.approx(sum(s for _, s in steps.values()) / sum(times))
    latency = _run_panel(store, "job.json", "Collective latency", "raw", {"job": simrun.JOB})
    # The baseline is the median of the first five probes (steps 0-2, ranks 0/1: 20, 21, 20, 21, 20).
    assert {r["baseline"] for r in latency} == {20.0}
    assert all(r["2× baseline"] == 40 for r in latency)
    assert max(r["latency"] for r in latency) > 40  # the last steps' 45 µs: above 2× baseline


def test_decisions_of_every_outcome_show_in_table_and_annotations(store: Store):
    picks = {"job": simrun.JOB}
    table = _run_panel(store, "rebalancer.json", "Decisions", "1h-rollup", picks)
    assert sorted(r["outcome"] for r in table) == ["advised", "kept", "pending", "rolled_back"]
    kept = next(r for r in table if r["outcome"] == "kept")
    assert kept["change"] == "batch_size: 8 → 16" and kept["gain"] == pytest.approx(100 * (13.2 / 11.5 - 1))
    assert next(r for r in table if r["outcome"] == "advised")["change"] == "advice only"
    tr = store.range("1h-rollup")
    variables = resolve_variables(store, DASHES["rebalancer.json"], tr, 300_000, picks)
    ann = DASHES["rebalancer.json"]["annotations"]["list"][0]
    cols, rows = store.run(expand_sql(ann["target"]["rawSql"], variables, tr, 300_000))
    assert len(rows) == 4
    assert {r[cols.index("tags")].split(",")[1] for r in rows} == {"advised", "kept", "pending", "rolled_back"}
    throughput = _panel("rebalancer.json", "Throughput")
    assert ann["filter"]["ids"] == [throughput["id"]]


def test_a_learning_knob_decision_shows_both_verdicts_as_check_prints_them(store: Store):
    """The rolled-back prefetch raise (its clip fraction climbed): the learning panel shows the throughput verdict
    and the learning verdict naming the signal — the words the decision's evidence holds and trimtab check prints;
    the sync_every raise still measured is in it as such; the batch-size decision (a knob that does not change
    learning) and the advice are not."""
    from trimtab.cli.render import verdicts_line
    from trimtab.grading.job_report import job_summaries
    from trimtab.store import jobs as job_store

    rows = _run_panel(store, "rebalancer.json", "Learning-knob decisions", "1h-rollup", {"job": simrun.JOB})
    assert [(r["change"], r["throughput verdict"], r["learning verdict"]) for r in rows[:1]] == [
        ("sync_every: 2 → 4", "being measured", "being measured")]
    assert len(rows) == 2, rows
    row = rows[1]
    stored = simrun.LEARNING_ROLLBACK_EVIDENCE["verdicts"]
    assert (row["change"], row["outcome"], row["signal"]) == ("prefetch: 2 → 4", "rolled_back", "clip_fraction")
    assert row["throughput verdict"] == stored["throughput"] == "not judged yet (closed on learning first)"
    assert row["learning verdict"] == stored["learning"] == \
        "broke: clip_fraction 0.04 → 0.15 (rose by +0.110, bound +0.05)"
    engine = open_engine(store.url)
    try:
        summary = job_summaries(engine, [job_store.get_job(engine, simrun.JOB)], decisions=10)[0]
    finally:
        engine.dispose()
    shown = [d for d in summary.decisions if d.verdicts]
    assert [d.verdicts for d in shown] == [stored]
    assert verdicts_line(shown[0].verdicts) == (f"throughput {row['throughput verdict']} · learning "
                                               f"{row['learning verdict']}")


def test_step_composition_is_graded_on_gpu_time_where_the_steps_report_it(store: Store):
    """Issue 22: a job whose evaluation launches kernels and returns (wall 0 s, GPU 0.6 s of a 1.1 s step): the
    composition panel shows the GPU shares the rebalancer grades (waiting keeps its wall time), and says the steps
    are on GPU time. (Runs last in this module: it adds a job, and removes it.)"""
    from sqlalchemy import delete, insert

    from trimtab.grading.signals import phase_share_pct, time_base
    from trimtab.grading.window import fold_step
    from trimtab.store.models import job_reports, jobs

    name, engine = "gpu-async", open_engine(store.url)
    wall = dict(generation_s=0.2, evaluation_s=0.0, update_s=0.8, wait_s=0.1, other_s=0.0)
    gpu = dict(gpu_generation_s=0.2, gpu_evaluation_s=0.6, gpu_update_s=0.2)
    try:
        with engine.begin() as c:
            job_id = simrun._job(c, name, 1, {"actor": [0]}, [simrun.HOST_A], {}, "advise", store.now_ms - 600_000)
            rows = [dict(job_id=job_id, step=i, rank=0, received_ms=store.now_ms - 60_000 + 1000 * i, step_time_s=1.1,
                         samples=8, **wall, **gpu) for i in range(10)]
            c.execute(insert(job_reports), rows)
        steps = [fold_step(r["step"], [r]) for r in rows]
        assert time_base(steps) == "gpu"
        tr = TimeRange(store.now_ms - 5 * 60_000, store.now_ms)
        sql = _panel("job.json", "Step composition")["targets"][0]["rawSql"]
        variables = resolve_variables(store, DASHES["job.json"], tr, 1000, {"job": name})
        cols, out = store.run(expand_sql(sql.replace("$__interval", "1000w"), variables, tr, 1000))
        assert len(out) == 1
        got = dict(zip(cols, out[0]))
        for phase in ("generation", "evaluation", "update", "wait", "other"):
            assert float(got[phase]) == pytest.approx(phase_share_pct(steps, phase), abs=1e-6), phase
        assert float(got["evaluation"]) == pytest.approx(100 * 0.6 / 1.1)
        assert float(got["wait"]) == pytest.approx(100 * 0.1 / 1.1)
        assert float(got["steps on GPU time"]) == 100
    finally:
        with engine.begin() as c:
            c.execute(delete(jobs).where(jobs.c.name == name))
        engine.dispose()


def test_the_gpu_time_panels_read_the_ledger_and_the_reports_phases(store: Store):
    picks = {"job": simrun.JOB}
    ledger = _run_panel(store, "job.json", "GPU time since the job began", "raw", picks)
    by_gpu: dict[str, float] = {}
    for r in ledger:  # every GPU's cells are all of its time: shares add up to 100 %
        by_gpu[r["GPU"]] = by_gpu.get(r["GPU"], 0.0) + float(r["share"])
    assert set(by_gpu) == {f"{simrun.HOST_A}:{g}" for g in range(4)}  # the job's roles' GPUs (critic, reward: silent)
    assert all(v == pytest.approx(100.0) for v in by_gpu.values())
    assert {(r["kind"], r["role"], r["phase or cause"]) for r in ledger if r["GPU"].endswith(":0")} >= {
        ("busy", "actor", "generation"), ("idle", "actor", "communication")}
    # One bucket over the whole run: each role's phase adds up its reports' seconds (GPU 0, 1: rank 0, 1; actor).
    tr = TimeRange(store.now_ms - 41 * 60_000, store.now_ms)
    sql = _panel("job.json", "GPU-seconds by role and phase")["targets"][0]["rawSql"]
    variables = resolve_variables(store, DASHES["job.json"], tr, 1000, picks)
    cols, rows = store.run(expand_sql(sql.replace("$__interval", "1000w"), variables, tr, 1000))
    got = {r[cols.index("metric")]: float(r[cols.index("GPU-seconds")]) for r in rows}
    want = sum(simrun.report(0, step, rank, 0, "h", latency=None, ooms=0)["generation_s"]
               for step in range(120) for rank in range(2))
    assert set(got) == {"actor · generation", "actor · evaluation", "actor · update", "actor · validation"}
    assert got["actor · generation"] == pytest.approx(want)


def test_both_dashboard_sets_chart_the_ledger():
    prom = load_dashboards()["balance-prometheus.json"]
    exprs = [t["expr"] for p in all_panels(prom) for t in p.get("targets", [])]
    assert any("rate(trimtab_job_gpu_seconds_total" in e and "by (role, phase)" in e for e in exprs)
    assert any("rate(trimtab_gpu_idle_seconds_total" in e and "by (cause)" in e for e in exprs)
    job = [t["rawSql"] for p in all_panels(DASHES["job.json"]) for t in p.get("targets", [])]
    assert any("FROM job_gpu_ledger" in q for q in job)
