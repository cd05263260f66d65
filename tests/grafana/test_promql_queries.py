"""Every PromQL query of the Prometheus dashboards, with its variables expanded as Grafana expands them, returns
series from a real Prometheus (Debian's package) that scraped a real trimtab app (the FastAPI app of `trimtab up`,
on loopback) fed by two simulated nodes — one with a GPU that has neither NVLink nor GPM, whose series must be
absent (never 0) and whose NVLink stat must read "unsupported" — once for each dcgm-exporter name generation the app
can speak (``metrics_dcgm_names``: current, legacy).

Skips, saying why, where no ``prometheus`` binary is installed — unless ``TRIMTAB_REQUIRE_PROMETHEUS=1``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Optional

import pytest

from tests.support.prometheus import prometheus, prometheus_binary, wait_for
from trimtab.agent.sampler import Sampler
from trimtab.api.context import ApiContext
from trimtab.contract.roles import RolePlacement
from trimtab.grading.ledger.ticker import LedgerTicker
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate

from . import simrun
from .dashboards import all_panels, load_dashboards, queries
from .grafana_expand import ALL, TimeRange, Variable, expand_promql, unexpanded

DASHES = {n: d for n, d in load_dashboards().items() if n.endswith("-prometheus.json")}
LABEL_VALUES_RE = re.compile(r"label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)")
QUERY_RESULT_RE = re.compile(r"query_result\((.+)\)", re.S)
N_GPUS = 6
UTIL = {"current": "DCGM_FI_DEV_GPU_UTIL_RATIO", "legacy": "DCGM_FI_DEV_GPU_UTIL"}  # what each generation exports


def _get(port: int, path: str, **params: Any) -> Any:
    url = f"http://127.0.0.1:{port}{path}?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


class Feed:
    """Both simulated nodes ticking every 0.5 s into the app's snapshot and store, as `trimtab up` feeds them."""

    def __init__(self, ctx: ApiContext):
        self.ctx = ctx
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: Optional[BaseException] = None

    def _run(self) -> None:
        writer = BatchWriter(self.ctx.engine)

        def on_batch(batch):
            self.ctx.snapshot.update(batch)
            writer.write(batch)

        samplers = [Sampler([src], on_batch, hostname=node.hostname) for node, src in simrun.sources()]
        try:
            while not self.stop.is_set():
                for s in samplers:
                    s.tick()
                self.stop.wait(0.5)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            self.error = exc
        finally:
            writer.close()

    def __enter__(self) -> "Feed":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture(scope="module", params=sorted(UTIL))
def prom(tmp_path_factory, request):
    """(Prometheus port, its log) once it has scraped every GPU of both nodes and the balance verdicts, from an app
    that names its DCGM series after dcgm-exporter's ``request.param`` generation."""
    binary = prometheus_binary()
    from tests.api.conftest import ServedApp
    from trimtab.api.app import create_app

    tmp = tmp_path_factory.mktemp("grafana-prom")
    engine = open_engine(f"sqlite:///{tmp}/trimtab.db")
    migrate(engine)
    ctx = ApiContext(engine=engine, mode="up", state_dir=tmp, metrics_dcgm_names=request.param)
    util = UTIL[request.param]
    _ledger_job(engine)
    ticker = LedgerTicker(engine, period_s=0.5)  # the GPU-time ledger's counters, as the server's ticker advances them
    try:
        with Feed(ctx) as feed, ServedApp(create_app(ctx)) as app, \
                prometheus(binary, app.port, tmp) as (port, log):
            ticker.start()
            wait_for(port, util, N_GPUS, log)
            wait_for(port, "trimtab_balance_value", 2, log)
            wait_for(port, "count_over_time(trimtab_gpu_idle_seconds_total[5m]) >= 3", 2, log)
            # busy once the ledger's window (10 s behind now) holds the nodes' first samples
            wait_for(port, "count_over_time(trimtab_job_gpu_seconds_total[5m]) >= 3", 2, log)
            # a few more scrapes, so range queries see more than one point
            wait_for(port, f"count_over_time({util}[5m]) >= 3", N_GPUS, log)
            yield port, log
            assert feed.error is None, feed.error
    finally:
        ticker.stop()
        engine.dispose()


def _ledger_job(engine) -> None:
    """A job holding GPU 0 of each node (registered a minute ago: the ledger stays 10 s behind now), sending no
    step reports: its GPUs are busy for their utilization and idle for the rest (cause unknown)."""
    import trimtab.store.jobs as job_store

    real = job_store.now_ms
    job_store.now_ms = lambda: int(time.time() * 1000) - 60_000
    try:
        job_store.register_job(engine, "ledger-job", 2, {}, [simrun.HOST_A, simrun.HOST_B], {}, "off", None, True,
                               roles=[RolePlacement("actor", simrun.HOST_A, (0,), ()),
                                      RolePlacement("reward", simrun.HOST_B, (0,), ())])
    finally:
        job_store.now_ms = real


def _query_result_text(series: dict) -> str:
    """A query_result() option's text as Grafana writes it: name{label="value", …} value timestamp_ms."""
    labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
    pairs = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    ts, value = series["value"]
    return f"{series['metric'].get('__name__', '')}{{{pairs}}} {value} {int(float(ts) * 1000)}"


def _variable_values(port: int, query: str, regex: str, now_s: float) -> list[str]:
    """The options of a variable: label_values() through the label values API, query_result() as an instant query
    whose series' texts the variable's regex (``/…/``, first capture group) turns into values, deduplicated."""
    if (m := QUERY_RESULT_RE.fullmatch(query.strip())) is not None:
        texts = [_query_result_text(s) for s in _get(port, "/api/v1/query", query=m.group(1), time=now_s)["result"]]
        if not regex:
            return texts
        pattern = re.compile(regex.strip("/"))
        found = [(hit.group(1) if hit.groups() else hit.group(0)) for t in texts if (hit := pattern.search(t))]
        return list(dict.fromkeys(found))
    m = LABEL_VALUES_RE.fullmatch(query.strip())
    assert m, f"neither a label_values() nor a query_result() query: {query}"
    selector, label = m.groups()
    params: dict[str, Any] = {"start": now_s - 300, "end": now_s}
    if selector:
        params["match[]"] = selector
    return _get(port, f"/api/v1/label/{label}/values", **params)


def resolve_variables(port: int, dash: dict, tr: TimeRange, picks: dict[str, Any]) -> dict[str, Variable]:
    out: dict[str, Variable] = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "datasource":
            continue
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        values = _variable_values(port, expand_promql(query, out, tr, 1000), v.get("regex", ""), tr.to_ms / 1000)
        assert values, f"variable {v['name']} has no options ({query})"
        out[v["name"]] = Variable.from_json(v, values, picks.get(v["name"], ALL))
    return out


def run(port: int, expr: str, tr: TimeRange, instant: bool) -> list[dict]:
    if instant:
        return _get(port, "/api/v1/query", query=expr, time=tr.to_ms / 1000)["result"]
    return _get(port, "/api/v1/query_range", query=expr, start=tr.from_ms / 1000, end=tr.to_ms / 1000,
                step="1s")["result"]


def _now_range() -> TimeRange:
    now = int(time.time() * 1000)
    return TimeRange(now - 20_000, now)


SCENARIOS = {"all": {}, "one-host-two-gpus": {"host": [simrun.HOST_A], "gpu": ["0", "2"]},
             "full-gpu-of-b": {"host": simrun.HOST_B, "gpu": "0"}}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", sorted(DASHES))
def test_every_promql_query_returns_series(prom, name: str, scenario: str):
    port, log = prom
    dash = DASHES[name]
    tr = _now_range()
    variables = resolve_variables(port, dash, tr, SCENARIOS[scenario])
    if scenario == "all":
        assert sorted(variables["host"].options) == [simrun.HOST_A, simrun.HOST_B]
    ran = 0
    for q in queries(name, dash):
        if q.fmt == "variable":
            continue
        expr = expand_promql(q.text, variables, tr, 1000)
        assert not unexpanded(expr), f"{name} {q.where}: unexpanded variable in {expr}"
        result = run(port, expr, tr, q.instant)
        assert result, f"{name} [{scenario}] {q.where}: no series for\n{expr}\nprometheus log:\n{log.read_text()[-2000:]}"
        legend_labels = re.findall(r"\{\{\s*(\w+)\s*\}\}", q.target.get("legendFormat", ""))
        for series in result:
            missing = [lbl for lbl in legend_labels if lbl not in series["metric"]]
            assert not missing, f"{name} {q.where}: legend needs {missing}, series has {series['metric']}"
        ran += 1
    assert ran == sum(len(p.get("targets", [])) for p in all_panels(dash))


def _panel_target(name: str, title_start: str, ref: str = "A") -> dict:
    panel = next(p for p in all_panels(DASHES[name]) if p["title"].startswith(title_start))
    return next(t for t in panel["targets"] if t["refId"] == ref)


def test_a_gpu_without_nvlink_or_gpm_is_absent_and_reads_unsupported(prom):
    port, _ = prom
    tr = _now_range()
    dash = DASHES["interconnect-prometheus.json"]
    bare = resolve_variables(port, dash, tr, {"host": simrun.HOST_B, "gpu": str(simrun.BARE_GPU)})
    full = resolve_variables(port, dash, tr, {"host": simrun.HOST_B, "gpu": "0"})
    for ref in ("A", "B"):  # NVLink TX / RX: no series at all, not a zero line
        expr = _panel_target("interconnect-prometheus.json", "NVLink TX / RX", ref)["expr"]
        assert run(port, expand_promql(expr, bare, tr, 1000), tr, False) == []
        assert len(run(port, expand_promql(expr, full, tr, 1000), tr, False)) == 1
    stat = _panel_target("interconnect-prometheus.json", "NVLink now")
    (series,) = run(port, expand_promql(stat["expr"], bare, tr, 1000), tr, True)
    assert float(series["value"][1]) == -1  # mapped to "unsupported" by the panel
    panel = next(p for p in all_panels(dash) if p["title"].startswith("NVLink now"))
    assert panel["fieldConfig"]["defaults"]["mappings"][0]["options"]["-1"]["text"] == "unsupported"
    (series,) = run(port, expand_promql(stat["expr"], full, tr, 1000), tr, True)
    assert float(series["value"][1]) > 0
    # No GPM on the bare GPU: no SM activity series; utilization is there.
    bal = DASHES["balance-prometheus.json"]
    bare_b = resolve_variables(port, bal, tr, {"host": simrun.HOST_B, "gpu": str(simrun.BARE_GPU)})
    sm = _panel_target("balance-prometheus.json", "SM activity")["expr"]
    util = _panel_target("balance-prometheus.json", "Utilization per GPU")["expr"]
    assert run(port, expand_promql(sm, bare_b, tr, 1000), tr, False) == []
    assert len(run(port, expand_promql(util, bare_b, tr, 1000), tr, False)) == 1
    # sim-b's spread falls back to utilization (one of its GPUs has no SM activity); sim-a's uses SM activity.
    spread = _panel_target("balance-prometheus.json", "Utilization spread")["expr"]
    all_vars = resolve_variables(port, bal, tr, {})
    by_host = {s["metric"]["hostname"]: float(s["value"][1])
               for s in run(port, expand_promql(spread, all_vars, tr, 1000), tr, True)}
    assert set(by_host) == {simrun.HOST_A, simrun.HOST_B}
    utils = {(s["metric"]["hostname"], s["metric"]["gpu"]): float(s["value"][1])
             for s in run(port, expand_promql(util, all_vars, tr, 1000), tr, True)}
    b_utils = [v for (h, _), v in utils.items() if h == simrun.HOST_B]
    assert by_host[simrun.HOST_B] == pytest.approx(max(b_utils) - min(b_utils))
    assert by_host[simrun.HOST_A] > 40  # actor-hot: act
