"""Panel by panel, the Prometheus dashboards show the same numbers, in the unit each panel declares, whichever
dcgm-exporter generation the scraped /metrics speaks.

One fixed snapshot (both simulated nodes, then no more ticks: values stay put) is served as four exporters would
show it, each scraped by its own real Prometheus: trimtab's current generation (4.10's names: ratios, bytes,
``hostname``) and legacy one (up to 4.8.2: percent, MiB, ``Hostname``), and, rewritten from those by the release
notes, what dcgm-exporter 4.8.3 (legacy names, ``hostname`` only) and 4.9.0 (the new names but the PCIe/NVLink
rates still ``…_BYTES``, and the ``DCGM_FI_SYSTEM_DRIVER_VERSION`` label) export. Every panel query that reads a DCGM
series is run in all four at the same instant: it must return series, the same series in each, and the value the
snapshot gives in the panel's unit (utilization in %, memory in bytes, rates in bytes/s).

Skips, saying why, where no ``prometheus`` binary is installed — unless ``TRIMTAB_REQUIRE_PROMETHEUS=1``.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Callable, Optional

import pytest

from tests.support.prometheus import prometheus, prometheus_binary, serve, wait_for
from trimtab.api.metrics import CONTENT_TYPE, render_metrics
from trimtab.agent.sampler import Sampler
from trimtab.api.context import ApiContext
from trimtab.api.live_view import LatestSnapshot
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate
from trimtab.store.queries import LatestSample

from . import simrun
from .dashboards import all_panels
from .grafana_expand import expand_promql
from .test_promql_queries import DASHES, N_GPUS, UTIL, _now_range, resolve_variables, run

TICKS = 3
RATES_PER_SECOND = re.compile(r"\b(DCGM_FI_PROF_(?:PCIE|NVLINK)_(?:TX|RX)_BYTES)_PER_SECOND\b")


def _as_4_8_3(text: str) -> str:
    """Legacy names, but the host label only as ``hostname`` (4.8.3 renamed ``Hostname``, PR #655)."""
    return re.sub(r'Hostname="[^"]*",?', "", text)


def _as_4_9_0(text: str) -> str:
    """Current names, but the PCIe/NVLink rates still ``…_BYTES`` (renamed in 4.10.0), and every DCGM series with
    the driver label 4.9.0 adds."""
    text = RATES_PER_SECOND.sub(r"\1", text)
    return re.sub(r"^(DCGM_FI_\w+)\{", r'\1{DCGM_FI_SYSTEM_DRIVER_VERSION="580.95.05",', text, flags=re.M)


# exporter → (trimtab's generation that serves it, how its text is rewritten)
EXPORTERS: dict[str, tuple[str, Callable[[str], str]]] = {
    "current": ("current", lambda t: t), "legacy": ("legacy", lambda t: t),
    "4.8.3": ("legacy", _as_4_8_3), "4.9.0": ("current", _as_4_9_0)}
GENERATIONS = sorted(EXPORTERS)


def _app(ctx: ApiContext, rewrite: Callable[[str], str]):
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def metrics(_request):
        return Response(rewrite(render_metrics(ctx).decode()), media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics)])


@pytest.fixture(scope="module")
def proms(tmp_path_factory):
    """{exporter: Prometheus port} and the snapshot's GPU rows, once each Prometheus has scraped every GPU."""
    binary = prometheus_binary()
    tmp = tmp_path_factory.mktemp("grafana-units")
    engine = open_engine(f"sqlite:///{tmp}/trimtab.db")
    migrate(engine)
    snapshot = LatestSnapshot()
    ctxs = {g: ApiContext(engine=engine, mode="up", state_dir=tmp, snapshot=snapshot, metrics_dcgm_names=g)
            for g in UTIL}
    for node, src in simrun.sources():
        sampler = Sampler([src], snapshot.update, hostname=node.hostname)
        for _ in range(TICKS):
            sampler.tick()
    rows = ctxs["current"].latest_gpus()
    assert len(rows) == N_GPUS
    try:
        with ExitStack() as stack:
            ports = {}
            for name, (generation, rewrite) in EXPORTERS.items():
                app_port = stack.enter_context(serve(_app(ctxs[generation], rewrite)))
                work = tmp / name
                work.mkdir()
                ports[name], log = stack.enter_context(prometheus(binary, app_port, work))
                wait_for(ports[name], UTIL[generation], N_GPUS, log)
                wait_for(ports[name], "DCGM_FI_DEV_FB_USED_BYTES or DCGM_FI_DEV_FB_USED", N_GPUS, log)
            yield ports, rows
    finally:
        engine.dispose()


Row = LatestSample
Expect = Callable[[Row], Optional[float]]  # the value a GPU's series must show (None: no series for that GPU)


def _m(field: str, scale: float = 1) -> Expect:
    return lambda r: None if r.metrics.get(field) is None else r.metrics[field] * scale


def _memory_pct(r: Row) -> float:
    m = r.metrics
    used, reserved, total = m["mem_used_bytes"], m.get("mem_reserved_bytes") or 0, m["mem_total_bytes"]
    return 100 * (used + reserved) / max(total, used + reserved)


def _nvlink_now(r: Row) -> float:
    tx, rx = r.metrics.get("nvlink_tx_bytes_per_s"), r.metrics.get("nvlink_rx_bytes_per_s")
    return -1 if tx is None or rx is None else tx + rx  # -1: "unsupported"


# panel title (start) → refId → the value of each GPU's series, in the panel's declared unit
PER_GPU: dict[str, dict[str, Expect]] = {
    "Utilization per GPU": {"A": _m("util_pct")},  # percent
    "SM activity per GPU": {"A": _m("sm_active_pct")},  # percent
    "PCIe TX / RX per GPU": {"A": _m("pcie_tx_bytes_per_s"), "B": _m("pcie_rx_bytes_per_s")},  # bytes/s
    "NVLink TX / RX per GPU": {"A": _m("nvlink_tx_bytes_per_s"), "B": _m("nvlink_rx_bytes_per_s")},  # bytes/s
    "NVLink now": {"A": _nvlink_now},  # bytes/s
    "Memory used + reserved, % of total": {"A": _memory_pct},  # percent
    "Memory used and reserved per GPU": {"A": _m("mem_used_bytes"), "B": _m("mem_reserved_bytes")},  # bytes
}
PER_HOST = ("Utilization spread",)  # points of %: SM activity spread where every GPU has it, else utilization
UNIT_OF = {"Utilization per GPU": "percent", "SM activity per GPU": "percent", "PCIe TX / RX per GPU": "Bps",
           "NVLink TX / RX per GPU": "Bps", "NVLink now": "Bps", "Memory used + reserved, % of total": "percent",
           "Memory used and reserved per GPU": "bytes", "Utilization spread": "none"}


def _spread(rows: list[Row], host: str) -> float:
    mine = [r for r in rows if r.hostname == host]
    field = "sm_active_pct" if all(r.metrics.get("sm_active_pct") is not None for r in mine) else "util_pct"
    values = [r.metrics[field] for r in mine]
    return max(values) - min(values)


def _dcgm_targets() -> list[tuple[str, dict, dict]]:
    """(dashboard, panel, target) of every Prometheus panel query that reads a DCGM series."""
    return [(name, panel, t) for name, dash in sorted(DASHES.items()) for panel in all_panels(dash)
            for t in panel.get("targets", []) if "DCGM_FI_" in t["expr"]]


def _key(series: dict) -> tuple:
    labels = series["metric"]
    return labels.get("hostname"), labels.get("gpu")


def _values(port: int, name: str, expr: str, tr) -> dict[tuple, float]:
    variables = resolve_variables(port, DASHES[name], tr, {})
    result = run(port, expand_promql(expr, variables, tr, 1000), tr, True)
    values = {_key(s): float(s["value"][1]) for s in result}
    assert len(values) == len(result), f"series collapse onto the same hostname/gpu: {result}"
    return values


def test_every_dcgm_panel_is_covered_here():
    titles = {panel["title"] for _, panel, _ in _dcgm_targets()}
    known = set(PER_GPU) | set(PER_HOST)
    assert all(any(t.startswith(k) for k in known) for t in titles), sorted(titles)
    for _, panel, _ in _dcgm_targets():
        unit = next(u for k, u in UNIT_OF.items() if panel["title"].startswith(k))
        assert panel["fieldConfig"]["defaults"]["unit"] == unit, panel["title"]


@pytest.mark.parametrize("name, title, ref", [(n, p["title"], t["refId"]) for n, p, t in _dcgm_targets()])
def test_a_panel_shows_the_same_values_in_its_unit_for_both_generations(proms, name, title, ref):
    ports, rows = proms
    panel = next(p for p in all_panels(DASHES[name]) if p["title"] == title)
    expr = next(t for t in panel["targets"] if t["refId"] == ref)["expr"]
    tr = _now_range()
    got = {g: _values(ports[g], name, expr, tr) for g in GENERATIONS}
    for g in GENERATIONS:
        assert got[g], f"{name} {title} / {ref}: no series from the {g} exporter"
        assert set(got[g]) == set(got["current"]), (g, title, ref)
    if title.startswith(PER_HOST):
        expected = {(host, None): _spread(rows, host) for host in {r.hostname for r in rows}}
    else:
        value_of = next(v for k, v in PER_GPU.items() if title.startswith(k))[ref]
        expected = {(r.hostname, str(r.gpu_index)): value_of(r) for r in rows if value_of(r) is not None}
    for g in GENERATIONS:
        assert got[g] == {k: pytest.approx(v, rel=1e-9, abs=1e-9) for k, v in expected.items()}, (g, title, ref)
