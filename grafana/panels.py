"""The building blocks of trimtab's Grafana dashboards: datasources, thresholds, the shared SQL pieces (time filter,
resolution switch, GPU label, job steps), panel and variable builders. ``node_boards.py`` and ``job_boards.py``
compose the dashboards from these (``generate.py`` writes them); keeping them apart keeps each file one idea (what a panel is vs. what each dashboard shows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from trimtab.contract.step_report import GPU_PHASES, NAMED_PHASES, OTHER_PHASE, PHASES as STEP_PHASES

HERE = Path(__file__).resolve().parent
DASHBOARD_DIR = HERE / "dashboards"

# -- datasources (grafana/provisioning/datasources/trimtab.yaml) ------------------------------------------------
PG_UID, PG_TYPE = "trimtab-postgres", "postgres"
PROM_UID, PROM_TYPE = "trimtab-prometheus", "prometheus"
PG = {"type": PG_TYPE, "uid": PG_UID}
PROM = {"type": PROM_TYPE, "uid": "${datasource}"}  # the Prometheus dashboards' datasource variable

# -- thresholds: src/trimtab/grading/rules.toml's defaults (tests/grafana compares them with that file) -----------------
SPREAD = (25.0, 40.0)          # utilization_spread: healthy below, act above (points)
PCIE = (70.0, 90.0)            # pcie: % of the link's per-direction peak
MEMORY = (90.0, 98.0)          # memory: (used + reserved) / total, %
FRAGMENTATION = (15.0, 25.0)   # fragmentation: %
LATENCY = (1.5, 2.0)           # collective_latency: × the job's baseline
GUIDES = {"generation": 45.0, "evaluation": 30.0, "communication": 15.0}  # step composition, % of step
PROBE_BASELINE_STEPS = 5       # [controller] probe_baseline_steps: the baseline is the median of the first probes
VERDICT_WINDOW_MS = 30_000     # `trimtab check`'s default window

# -- resolution switch: trimtab.store.queries.AUTO_RAW_MAX_MS / AUTO_1M_MAX_MS -----------------------------------
RAW_MAX_MS = 2 * 3_600_000
ROLLUP_1M_MAX_MS = 72 * 3_600_000

PHASES = STEP_PHASES  # every phase a step report carries (the store's <phase>_s columns)

def graded_phase_columns(phases: Iterable[str]) -> str:
    """Select columns of a job_steps CTE: each of ``phases`` as step composition grades it — a step that carries
    GPU time (the hook's CUDA events, the store's gpu_<phase>_s) counts each phase's GPU seconds where it has them
    and its wall seconds where not (waiting for rollout; host-side framework timers), "other" then being the
    step's wall time the named phases leave; a step without GPU time counts wall time. Also ``gpu_timed`` (1/0)."""
    gpu_timed = "(" + " OR ".join(f"r.gpu_{p}_s IS NOT NULL" for p in GPU_PHASES) + ")"

    def graded(p: str) -> str:
        if p in GPU_PHASES:
            return f"coalesce(max(r.gpu_{p}_s), max(r.{p}_s))"
        return f"max(r.{p}_s)"

    named = " + ".join(f"coalesce({graded(p)}, 0)" for p in NAMED_PHASES)
    cols = []
    for p in phases:
        if p == OTHER_PHASE:
            gpu_other = f"greatest(0, max(r.step_time_s) - ({named}))"
            cols.append(f"CASE WHEN bool_or{gpu_timed} THEN {gpu_other} ELSE max(r.{p}_s) END AS {p}")
        else:
            cols.append(f"CASE WHEN bool_or{gpu_timed} THEN {graded(p)} ELSE max(r.{p}_s) END AS {p}")
    return ", ".join(cols) + f", CASE WHEN bool_or{gpu_timed} THEN 1 ELSE 0 END AS gpu_timed"

ALL_JOBS = "__all"  # the GPU dashboards' job variable's "All": no job narrows the GPUs

# ---------------------------------------------------------------------------------------------------------------
# SQL building blocks
# ---------------------------------------------------------------------------------------------------------------

GPU_IDS = "gpu_id IN (SELECT id FROM gpus WHERE uuid IN ($gpu))"
# How a GPU is named in every legend and table: host, index, and a mark on simulated nodes.
GPU_LABEL = ("n.hostname || ' GPU ' || g.gpu_index || CASE WHEN n.simulated THEN ' (simulated)' ELSE '' END")
RANGE_MS = "$__to - $__from"


def gpu_source(*metrics: str) -> str:
    """A subquery ``s(gpu_id, t, w, metric…)`` over the selected GPUs and the time range: raw samples (w = 1) for
    ranges up to 2 h, else 1-minute or 1-hour rollup means (w = samples in the bucket). PostgreSQL plans the two
    branches whose range test is false as one-time filters and never reads their tables."""
    raw = ", ".join(metrics)
    means = ", ".join(f"{m}_mean" for m in metrics)
    return (
        f"(SELECT gpu_id, ts_ms AS t, 1 AS w, {raw} FROM gpu_samples\n"
        f"   WHERE {RANGE_MS} <= {RAW_MAX_MS} AND ts_ms BETWEEN $__from AND $__to AND {GPU_IDS}\n"
        f" UNION ALL\n"
        f" SELECT gpu_id, bucket_ms, n, {means} FROM gpu_rollup_1m\n"
        f"   WHERE {RANGE_MS} > {RAW_MAX_MS} AND {RANGE_MS} <= {ROLLUP_1M_MAX_MS}"
        f" AND bucket_ms BETWEEN $__from AND $__to AND {GPU_IDS}\n"
        f" UNION ALL\n"
        f" SELECT gpu_id, bucket_ms, n, {means} FROM gpu_rollup_1h\n"
        f"   WHERE {RANGE_MS} > {ROLLUP_1M_MAX_MS} AND bucket_ms BETWEEN $__from AND $__to AND {GPU_IDS}) AS s\n"
        f"JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id"
    )


def wavg(expr: str) -> str:
    """The sample-weighted mean of ``expr`` over a group of ``s`` rows; NULL where every value is NULL."""
    return f"sum(({expr}) * s.w) / sum(CASE WHEN ({expr}) IS NOT NULL THEN s.w END)"


BUCKET = "$__unixEpochGroupAlias(s.t / 1000.0, $__interval)"


def per_gpu_series(value: str, name: str, metrics: Iterable[str], label_suffix: str = "",
                   not_null: Optional[str] = None) -> str:
    """Time series, one per GPU (``metric`` = the GPU's label): ``value`` (an aggregate over ``s``) as ``name``.
    Rows where ``not_null`` is NULL (an unsupported metric) are left out, so such a GPU has no series at all."""
    where = f"\nWHERE {not_null} IS NOT NULL" if not_null else ""
    suffix = f" || '{label_suffix}'" if label_suffix else ""
    return (f"SELECT {BUCKET},\n  {GPU_LABEL}{suffix} AS metric,\n  {value} AS \"{name}\"\n"
            f"FROM {gpu_source(*metrics)}{where}\nGROUP BY 1, 2\nORDER BY 1, 2")


JOB_IS = "j.name = '$job'"
# The GPU dashboards' job variable: "All" (ALL_JOBS) selects every job.
JOB_MATCHES = f"('${{job:raw}}' = '{ALL_JOBS}' OR j.name = '${{job:raw}}')"


def job_steps(job_filter: str, columns: str, extra_where: str = "") -> str:
    """A CTE body: the job's reports in range folded into steps (slowest rank, summed samples)."""
    return (f"SELECT j.name AS job, r.step, max(r.received_ms) AS t, {columns}\n"
            f"  FROM job_reports r JOIN jobs j ON j.id = r.job_id\n"
            f"  WHERE {job_filter} AND r.received_ms BETWEEN $__from AND $__to{extra_where}\n"
            f"  GROUP BY j.name, r.step")


STEP_BUCKET = "$__unixEpochGroupAlias(t / 1000.0, $__interval)"

# ---------------------------------------------------------------------------------------------------------------
# Panels
# ---------------------------------------------------------------------------------------------------------------


def sql(raw: str, fmt: str = "time_series", ref: str = "A") -> dict:
    return {"refId": ref, "datasource": PG, "editorMode": "code", "format": fmt, "rawQuery": True, "rawSql": raw}


def promql(expr: str, legend: str, ref: str = "A", instant: bool = False) -> dict:
    return {"refId": ref, "datasource": PROM, "editorMode": "code", "expr": expr, "legendFormat": legend,
            "range": not instant, "instant": instant}


def bands(healthy: float, act: float) -> dict:
    return {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": healthy},
                                          {"color": "red", "value": act}]}


def unsupported_if_null() -> dict:
    return {"type": "special", "options": {"match": "null", "result": {"text": "unsupported", "color": "text"}}}


STATUS_MAPPINGS = [{"type": "value", "options": {
    "ok": {"text": "ok", "color": "green", "index": 0},
    "watch": {"text": "watch", "color": "orange", "index": 1},
    "act": {"text": "act", "color": "red", "index": 2},
    "no data": {"text": "no data", "color": "text", "index": 3},
    "unsupported": {"text": "unsupported", "color": "text", "index": 4}}}]

OUTCOME_MAPPINGS = [{"type": "value", "options": {
    "kept": {"text": "kept", "color": "green", "index": 0},
    "rolled_back": {"text": "rolled back", "color": "red", "index": 1},
    "pending": {"text": "pending", "color": "blue", "index": 2},
    "advised": {"text": "advised", "color": "purple", "index": 3},
    "superseded": {"text": "superseded", "color": "text", "index": 4},
    "cancelled": {"text": "cancelled", "color": "text", "index": 5}}}]


def override(name: str, **props: Any) -> dict:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in props.items()]}


def timeseries(title: str, description: str, targets: list[dict], unit: str, *, thresholds: Optional[dict] = None,
               stack: bool = False, min_: Optional[float] = 0, max_: Optional[float] = None,
               no_value: Optional[str] = None, overrides: Optional[list] = None, w: int = 12, h: int = 8,
               draw: str = "line") -> dict:
    custom: dict[str, Any] = {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 25 if stack else 0,
                              "showPoints": "never", "spanNulls": False,
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                              "thresholdsStyle": {"mode": "line+area" if thresholds else "off"}}
    defaults: dict[str, Any] = {"unit": unit, "custom": custom,
                                "thresholds": thresholds or {"mode": "absolute",
                                                             "steps": [{"color": "green", "value": None}]}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if no_value:
        defaults["noValue"] = no_value
    return {"type": "timeseries", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "_size": (w, h)}


def table(title: str, description: str, target: dict, columns: list[str], *, overrides: Optional[list] = None,
          w: int = 24, h: int = 8, unit: Optional[str] = None) -> dict:
    """A table whose query returns exactly ``columns`` (an organize transformation pins their order; the tests
    check the query's columns against it)."""
    defaults: dict[str, Any] = {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}}
    if unit:
        defaults["unit"] = unit
    return {"type": "table", "title": title, "description": description, "targets": [target],
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
            "transformations": [{"id": "organize", "options": {
                "indexByName": {c: i for i, c in enumerate(columns)}, "excludeByName": {}, "renameByName": {}}}],
            "_size": (w, h)}


def stat(title: str, description: str, targets: list[dict], unit: str, *, mappings: Optional[list] = None,
         thresholds: Optional[dict] = None, no_value: Optional[str] = None, w: int = 12, h: int = 6,
         columns: Optional[list[str]] = None, color_mode: str = "value", overrides: Optional[list] = None,
         display_name: Optional[str] = None) -> dict:
    defaults: dict[str, Any] = {"unit": unit, "mappings": mappings or [],
                                "thresholds": thresholds or {"mode": "absolute",
                                                             "steps": [{"color": "text", "value": None}]}}
    if no_value:
        defaults["noValue"] = no_value
    if display_name:
        defaults["displayName"] = display_name
    panel = {"type": "stat", "title": title, "description": description, "targets": targets,
             "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
             "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": columns is not None},
                         "colorMode": color_mode, "graphMode": "none", "textMode": "value_and_name",
                         "orientation": "horizontal", "justifyMode": "auto"},
             "_size": (w, h)}
    if columns is not None:
        panel["transformations"] = [{"id": "organize", "options": {
            "indexByName": {c: i for i, c in enumerate(columns)}, "excludeByName": {}, "renameByName": {}}}]
    return panel


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def layout(panels: list[dict]) -> list[dict]:
    """Ids in order; grid positions filled left to right, top to bottom."""
    x = y = row_h = 0
    out = []
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p = {"id": i, **p, "gridPos": {"h": h, "w": w, "x": x, "y": y}}
        if p["type"] != "row":
            p["datasource"] = p["targets"][0]["datasource"]
        x += w
        row_h = max(row_h, h)
        out.append(p)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Variables
# ---------------------------------------------------------------------------------------------------------------


def query_var(name: str, label: str, query: str, ds: dict, *, multi: bool, include_all: bool,
              all_value: Optional[str] = None, description: str = "", regex: str = "", sort: int = 0) -> dict:
    current: dict = {}
    if include_all:
        current = {"selected": True, "text": ["All"] if multi else "All", "value": ["$__all"] if multi else "$__all"}
    var = {"name": name, "label": label, "type": "query", "datasource": ds, "description": description,
           "query": query, "definition": query, "refresh": 2, "sort": sort, "multi": multi, "includeAll": include_all,
           "current": current, "options": [], "hide": 0, "regex": regex}
    if all_value is not None:
        var["allValue"] = all_value
    return var


PG_HOST = query_var("host", "Host", "SELECT hostname FROM nodes ORDER BY hostname", PG, multi=True,
                    include_all=True, description="Nodes in the store.")
PG_JOB_FOR_GPUS = query_var(
    "job", "Job", "SELECT name FROM jobs ORDER BY name", PG, multi=False, include_all=True, all_value=ALL_JOBS,
    description="A job narrows the GPU list to the GPUs of its device_map on its hosts; All: every GPU.")
PG_GPU = query_var(
    "gpu", "GPU",
    f"SELECT {GPU_LABEL} AS __text, g.uuid AS __value\n"
    "FROM gpus g JOIN nodes n ON n.id = g.node_id\n"
    "WHERE n.hostname IN ($host) AND g.gpu_index >= 0\n"
    f"  AND ('${{job:raw}}' = '{ALL_JOBS}' OR EXISTS (\n"
    "    SELECT 1 FROM jobs j CROSS JOIN LATERAL json_each(j.device_map) AS d(component, gpus)\n"
    "      CROSS JOIN LATERAL json_array_elements_text(d.gpus) AS i(gpu_index)\n"
    "    WHERE j.name = '${job:raw}' AND i.gpu_index::int = g.gpu_index\n"
    "      AND (json_array_length(j.hostnames) = 0\n"
    "           OR n.hostname IN (SELECT json_array_elements_text(j.hostnames)))))\n"
    "ORDER BY n.hostname, g.gpu_index", PG, multi=True, include_all=True,
    description="GPUs of the selected hosts (and job).")
PG_JOB = query_var("job", "Job", "SELECT name FROM jobs ORDER BY name", PG, multi=False, include_all=False,
                   description="The training job (as registered by its trainer hook).")

PROM_DS = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": PROM_TYPE,
           "current": {"selected": True, "text": "trimtab Prometheus", "value": PROM_UID}, "hide": 0,
           "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": "",
           "description": "A Prometheus that scrapes trimtab's /metrics (or dcgm-exporter)."}
# -- dcgm-exporter's generations (trimtab.api.metrics.dcgm_names): every Prometheus panel accepts both ----------
# The host label is `Hostname` up to dcgm-exporter 4.8.2 and `hostname` since 4.8.3 (and on trimtab's own series);
# 4.9.0 renamed fields and changed units (utilization % → ratio, MiB → bytes), 4.10.0 renamed PCIe/NVLink rates.
# A panel selects a measurement under either name and either host label, scales each to the panel's unit, and
# copies `Hostname` into `hostname`, so legends and aggregations say `hostname` whatever the exporter.
UTIL_CURRENT, UTIL_LEGACY = "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_GPU_UTIL"  # ratio 0-1 / percent
SM_ACTIVE = "DCGM_FI_PROF_SM_UTIL_RATIO|DCGM_FI_PROF_SM_ACTIVE"  # ratio 0-1 in both
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND|DCGM_FI_PROF_PCIE_TX_BYTES"  # bytes/s in both
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND|DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND|DCGM_FI_PROF_NVLINK_TX_BYTES"
NVLINK_RX = "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND|DCGM_FI_PROF_NVLINK_RX_BYTES"
MIB = 1048576  # the legacy framebuffer unit, in bytes


def either_host(names: str, extra: str = ', gpu=~"$gpu"') -> str:
    """Series named by the regex ``names`` on the selected hosts, whichever label spells the host (a series with
    both matches both selectors once: ``or`` keeps one)."""
    return (f'({{__name__=~"{names}", Hostname=~"$host"{extra}}}'
            f' or {{__name__=~"{names}", hostname=~"$host"{extra}}})')


def with_hostname(expr: str) -> str:
    """``expr`` with `Hostname` copied into `hostname` where a series has it (dcgm-exporter up to 4.8.2)."""
    return f'label_replace({expr}, "hostname", "$1", "Hostname", "(.+)")'


def dcgm(names: str, scale: float = 1, legacy: Optional[str] = None, legacy_scale: float = 1) -> str:
    """A DCGM measurement on the selected hosts and GPUs in the panel's unit: ``names`` (a regex of the names that
    share one unit) × ``scale``, or, for a field whose unit changed, ``legacy`` × ``legacy_scale`` where the
    current name is absent."""
    def scaled(regex: str, k: float) -> str:
        return either_host(regex) if k == 1 else f"{k:.15g} * {either_host(regex)}"

    expr = scaled(names, scale) if legacy is None else f"({scaled(names, scale)} or {scaled(legacy, legacy_scale)})"
    return with_hostname(expr)


UTIL_PCT = dcgm(UTIL_CURRENT, 100, UTIL_LEGACY, 1)  # kernel-busy utilization, %
SM_ACTIVE_PCT = dcgm(SM_ACTIVE, 100)  # SM activity, %


def fb_bytes(part: str) -> str:
    """Framebuffer ``part`` (USED, RESERVED, FREE) in bytes: FB_<part>_BYTES (4.9.0 on) or FB_<part> (MiB)."""
    return dcgm(f"DCGM_FI_DEV_FB_{part}_BYTES", 1, f"DCGM_FI_DEV_FB_{part}", MIB)


UTIL_ANY = f"{UTIL_CURRENT}|{UTIL_LEGACY}"
ANY_UTIL_SERIES = '{__name__=~"' + UTIL_ANY + '"}'
PROM_HOST = query_var(
    "host", "Host", f"query_result(count by (hostname) ({with_hostname(ANY_UTIL_SERIES)}))", PROM, multi=True,
    include_all=True, all_value=".*", regex='/hostname="([^"]+)"/', sort=1,
    description="Nodes with GPU utilization series (dcgm-exporter's hostname label, or Hostname up to 4.8.2).")
PROM_GPU = query_var(
    "gpu", "GPU", f"query_result(count by (gpu) {either_host(UTIL_ANY, extra='')})", PROM, multi=True,
    include_all=True, all_value=".*", regex='/gpu="([^"]+)"/', sort=3, description="GPU indexes on the selected hosts.")
LEGEND = "{{hostname}} GPU {{gpu}}"
TRIMTAB_SEL = 'hostname=~"$host", gpu=~"$gpu"'  # trimtab's own per-GPU series: `hostname` in every generation


def dashboard(uid: str, title: str, description: str, variables: list[dict], panels: list[dict],
              annotations: Optional[list[dict]] = None, tags: Iterable[str] = ()) -> dict:
    laid = layout(panels)
    ann = []
    for a in annotations or []:
        a = dict(a)
        titles = a.pop("_panels", None)
        if titles is not None:
            ids = [p["id"] for p in laid if p["title"] in titles]
            assert len(ids) == len(titles), (titles, ids)
            a["filter"] = {"exclude": False, "ids": ids}
        ann.append(a)
    return {
        "id": None, "uid": uid, "title": title, "description": description,
        "tags": ["trimtab", *tags], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "links": [{"title": "trimtab dashboards", "type": "dashboards", "tags": ["trimtab"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "templating": {"list": variables},
        "annotations": {"list": ann},
        "panels": laid,
    }


