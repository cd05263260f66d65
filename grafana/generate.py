#!/usr/bin/env python3
"""Writes trimtab's Grafana dashboards (``grafana/dashboards/*.json``) from the definitions below.

The JSON files are what Grafana provisions and what the tests read; this script is how they are made, so that
the SQL of every GPU panel shares one time filter, one resolution switch and one GPU label, and the threshold bands
are written once. Edit here, then run::

    python3 grafana/generate.py          # rewrite the JSON files
    python3 grafana/generate.py --check  # exit 1 if a JSON file differs from what this script writes

Conventions (grafana/README.md explains them for readers of the dashboards):

* Store times are epoch milliseconds. Filters use Grafana's global ``$__from`` / ``$__to`` (epoch ms), so the
  ``ts_ms`` indexes are used; buckets use ``$__unixEpochGroupAlias(<ms> / 1000.0, $__interval)``.
* GPU panels pick their table by the width of the time range, as the API's ``resolution=auto`` does: raw samples
  up to 2 h, 1-minute rollups up to 72 h, 1-hour rollups beyond. Means of rollup buckets are weighted by their
  sample count.
* A metric a GPU does not support is NULL in the store and absent in Prometheus. Time series leave such a GPU out
  (no flat zero line) and say "unsupported" when nothing is left; tables map NULL to "unsupported".
* Job panels fold the ranks' reports into steps as the rebalancer does (``trimtab.grading.window``): a step
  lasts as long as its slowest rank, each phase takes the slowest rank's time, samples add up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # panels.py sits next to this script

from panels import *  # noqa: E402,F401,F403  (the building blocks; the tests read the thresholds through here)
from panels import DASHBOARD_DIR, HERE  # noqa: E402,F401

# ---------------------------------------------------------------------------------------------------------------
# Balance
# ---------------------------------------------------------------------------------------------------------------

NODES_TABLE = table(
    "Nodes", "Each selected node: whether its data is simulated (no NVIDIA driver: synthetic readings), its "
    "scenario, how many GPUs it has, and when it was last heard from.",
    sql("SELECT n.hostname AS \"host\", CASE WHEN n.simulated THEN 'simulated' ELSE 'real' END AS \"data\",\n"
        "  n.scenario AS \"scenario\", count(g.id) AS \"GPUs\", to_timestamp(n.last_seen_ms / 1000.0) AS \"last seen\"\n"
        "FROM nodes n LEFT JOIN gpus g ON g.node_id = n.id AND g.gpu_index >= 0\n"
        "WHERE n.hostname IN ($host)\nGROUP BY n.id ORDER BY 1", "table"),
    ["host", "data", "scenario", "GPUs", "last seen"], w=12, h=6)

SPREAD_SQL = (
    "SELECT \"time\", metric,\n"
    "  CASE WHEN count(sm) = count(*) THEN max(sm) - min(sm) ELSE max(util) - min(util) END AS \"spread\"\n"
    "FROM (\n"
    f"  SELECT {BUCKET}, n.hostname AS metric, s.gpu_id,\n"
    f"    {wavg('s.util_pct')} AS util, {wavg('s.sm_active_pct')} AS sm\n"
    f"  FROM {gpu_source('util_pct', 'sm_active_pct')}\n"
    "  GROUP BY 1, 2, 3) AS per_gpu\n"
    "WHERE util IS NOT NULL OR sm IS NOT NULL\n"
    "GROUP BY 1, 2\nORDER BY 1, 2")

VERDICT_SQL = (
    "WITH w AS (\n"
    "  SELECT n.hostname, g.id,\n"
    "    avg(s.util_pct) AS util, avg(s.sm_active_pct) AS sm,\n"
    "    100 * greatest(avg(s.pcie_tx_bytes_per_s), avg(s.pcie_rx_bytes_per_s)) / max(g.pcie_peak_bytes_per_s)"
    " AS pcie_pct,\n"
    "    100 * (avg(s.mem_used_bytes) + coalesce(avg(s.mem_reserved_bytes), 0))\n"
    "        / coalesce(avg(s.mem_total_bytes), max(g.memory_total_bytes)) AS mem_pct\n"
    "  FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id\n"
    f"  WHERE s.ts_ms > $__to - {VERDICT_WINDOW_MS} AND s.ts_ms <= $__to AND s.{GPU_IDS}\n"
    "  GROUP BY n.hostname, g.id\n"
    "), v AS (\n"
    "  SELECT hostname, 'utilization_spread' AS chk, 'pts' AS unit,\n"
    "    CASE WHEN count(sm) = count(*) THEN max(sm) - min(sm) ELSE max(util) - min(util) END AS value,\n"
    f"    {SPREAD[0]} AS healthy, {SPREAD[1]} AS act FROM w GROUP BY hostname\n"
    f"  UNION ALL SELECT hostname, 'pcie', '% of link peak', max(pcie_pct), {PCIE[0]}, {PCIE[1]}"
    " FROM w GROUP BY hostname\n"
    f"  UNION ALL SELECT hostname, 'memory', '% of total', max(mem_pct), {MEMORY[0]}, {MEMORY[1]}"
    " FROM w GROUP BY hostname\n"
    ")\n"
    "SELECT hostname AS \"host\", chk AS \"check\", round(value::numeric, 1)::float8 AS \"value\", unit AS \"unit\",\n"
    "  CASE WHEN value IS NULL THEN CASE WHEN chk = 'utilization_spread' THEN 'no data' ELSE 'unsupported' END\n"
    "       WHEN value > act THEN 'act' WHEN value >= healthy THEN 'watch' ELSE 'ok' END AS \"status\",\n"
    "  healthy AS \"healthy below\", act AS \"act above\"\n"
    "FROM v ORDER BY 1, 2")


def balance_pg() -> dict:
    util = per_gpu_series(wavg("s.util_pct"), "utilization", ["util_pct"], not_null="s.util_pct")
    sm = per_gpu_series(wavg("s.sm_active_pct"), "SM activity", ["sm_active_pct"], not_null="s.sm_active_pct")
    panels = [
        timeseries("Utilization per GPU (NVML, %)",
                   "NVML kernel-busy utilization: the share of time at least one kernel ran (what nvidia-smi shows). "
                   "A GPU running one tiny kernel at a time reads ~100 %: compare with SM activity.",
                   [sql(util)], "percent", max_=100, no_value="no samples"),
        timeseries("SM activity per GPU (GPM, %)",
                   "The share of SMs busy, averaged over each sample interval (NVML GPM, Hopper and newer). "
                   "GPUs without GPM have no line.", [sql(sm)], "percent", max_=100,
                   no_value="unsupported (no GPM on the selected GPUs)"),
        timeseries("Utilization spread (max − min across GPUs, points)",
                   f"Per node, the highest minus the lowest per-GPU mean activity in each interval: SM activity "
                   f"when every selected GPU has it, else NVML utilization (as the rebalancer's rule). Healthy "
                   f"below {SPREAD[0]:g} points (green), watch up to {SPREAD[1]:g}, act above (red).",
                   [sql(SPREAD_SQL)], "none", thresholds=bands(*SPREAD), w=24),
        table("Verdict per threshold (last 30 s of the range)",
              "What `trimtab check` grades, per node, over the last 30 seconds of the selected range: utilization "
              "spread, the worst GPU's PCIe use (% of link peak) and memory use (% of total), each against the "
              "thresholds of src/trimtab/grading/rules.toml. act: above the act threshold; watch: between the two; ok: below healthy.",
              sql(VERDICT_SQL, "table"),
              ["host", "check", "value", "unit", "status", "healthy below", "act above"],
              overrides=[override("status", mappings=STATUS_MAPPINGS,
                                  custom__cellOptions={"type": "color-background"})], w=12, h=6),
        NODES_TABLE,
    ]
    return dashboard("trimtab-balance", "trimtab · Balance",
                     "Is the work spread evenly over the GPUs? Utilization spread, per-GPU busy and SM activity.",
                     [PG_HOST, PG_JOB_FOR_GPUS, PG_GPU], panels, tags=["gpu", "postgresql"])


SPREAD_PROM = (
    f'(max by (Hostname) (100 * DCGM_FI_PROF_SM_ACTIVE{{{SEL}}}) - min by (Hostname) (100 * DCGM_FI_PROF_SM_ACTIVE{{{SEL}}}))\n'
    f'  and on (Hostname) (count by (Hostname) (DCGM_FI_PROF_SM_ACTIVE{{{SEL}}}) == count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{{SEL}}}))\n'
    f'or\n(max by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{{SEL}}}) - min by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{{SEL}}}))')


def balance_prom() -> dict:
    panels = [
        timeseries("Utilization per GPU (NVML, %)", "DCGM_FI_DEV_GPU_UTIL: kernel-busy utilization.",
                   [promql(f"DCGM_FI_DEV_GPU_UTIL{{{SEL}}}", LEGEND)], "percent", max_=100, no_value="no samples"),
        timeseries("SM activity per GPU (GPM, %)", "DCGM_FI_PROF_SM_ACTIVE × 100: the share of SMs busy.",
                   [promql(f"100 * DCGM_FI_PROF_SM_ACTIVE{{{SEL}}}", LEGEND)], "percent", max_=100,
                   no_value="unsupported (no SM activity on the selected GPUs)"),
        timeseries("Utilization spread (max − min across GPUs, points)",
                   f"Per node: SM activity spread when every selected GPU reports SM activity, else utilization "
                   f"spread. Healthy below {SPREAD[0]:g} points, act above {SPREAD[1]:g}.",
                   [promql(SPREAD_PROM, "{{Hostname}}")], "none", thresholds=bands(*SPREAD), w=24),
        stat("Verdict per threshold (trimtab, last 30 s)",
             "trimtab_balance_status per node and check (0 ok, 1 watch, 2 act), as `trimtab check` grades the last "
             "30 seconds. trimtab's own series: a dcgm-exporter-only Prometheus has no data here.",
             [promql('trimtab_balance_status{hostname=~"$host"}', "{{hostname}} {{check}}", instant=True)], "none",
             mappings=[{"type": "value", "options": {"0": {"text": "ok", "color": "green", "index": 0},
                                                     "1": {"text": "watch", "color": "orange", "index": 1},
                                                     "2": {"text": "act", "color": "red", "index": 2}}}],
             color_mode="background", w=12, h=6),
        stat("Simulated nodes", "trimtab_node_simulated: 1 where a node's data is synthetic (no NVIDIA driver).",
             [promql('trimtab_node_simulated{hostname=~"$host"}', "{{hostname}}", instant=True)], "none",
             mappings=[{"type": "value", "options": {"0": {"text": "real", "index": 0},
                                                     "1": {"text": "simulated", "color": "purple", "index": 1}}}],
             w=12, h=6),
    ]
    return dashboard("trimtab-balance-prom", "trimtab · Balance (Prometheus)",
                     "The Balance dashboard's GPU panels on Prometheus (trimtab /metrics or dcgm-exporter).",
                     [PROM_DS, PROM_HOST, PROM_GPU], panels, tags=["gpu", "prometheus"])


# ---------------------------------------------------------------------------------------------------------------
# Interconnect
# ---------------------------------------------------------------------------------------------------------------

LINKS_SQL = (
    "SELECT n.hostname AS \"host\", g.gpu_index AS \"gpu\", g.name AS \"model\",\n"
    "  'Gen' || g.pcie_max_gen || ' x' || g.pcie_max_width AS \"PCIe link\", g.pcie_peak_bytes_per_s AS \"PCIe peak\",\n"
    f"  {wavg('s.pcie_tx_bytes_per_s')} AS \"PCIe TX\", {wavg('s.pcie_rx_bytes_per_s')} AS \"PCIe RX\",\n"
    f"  g.nvlink_link_count AS \"NVLink links\",\n"
    f"  {wavg('s.nvlink_tx_bytes_per_s')} AS \"NVLink TX\", {wavg('s.nvlink_rx_bytes_per_s')} AS \"NVLink RX\"\n"
    f"FROM {gpu_source('pcie_tx_bytes_per_s', 'pcie_rx_bytes_per_s', 'nvlink_tx_bytes_per_s', 'nvlink_rx_bytes_per_s')}\n"
    "GROUP BY n.hostname, g.id\nORDER BY 1, 2")
LINK_COLUMNS = ["host", "gpu", "model", "PCIe link", "PCIe peak", "PCIe TX", "PCIe RX", "NVLink links", "NVLink TX",
                "NVLink RX"]


def interconnect_pg() -> dict:
    pcie = ["pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"]
    pct = "100 * {avg} / g.pcie_peak_bytes_per_s"

    def pct_series(col: str, suffix: str) -> str:
        return (f"SELECT {BUCKET},\n  {GPU_LABEL} || '{suffix}' AS metric,\n"
                f"  {pct.format(avg=wavg('s.' + col))} AS \"% of peak\"\n"
                f"FROM {gpu_source(col)}\nWHERE s.{col} IS NOT NULL AND g.pcie_peak_bytes_per_s > 0\n"
                "GROUP BY 1, 2, g.pcie_peak_bytes_per_s\nORDER BY 1, 2")

    nvlink = ["nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"]
    panels = [
        timeseries("PCIe TX / RX per GPU (bytes/s)",
                   "PCIe traffic from (TX) and to (RX) each GPU, protocol headers included (NVML GPM, or the PCIe "
                   "throughput counter before Hopper). GPUs that cannot measure it have no line.",
                   [sql(per_gpu_series(wavg("s.pcie_tx_bytes_per_s"), "TX", pcie, " TX", "s.pcie_tx_bytes_per_s")),
                    sql(per_gpu_series(wavg("s.pcie_rx_bytes_per_s"), "RX", pcie, " RX", "s.pcie_rx_bytes_per_s"),
                        ref="B")],
                   "Bps", no_value="unsupported (no PCIe counters on the selected GPUs)"),
        timeseries("PCIe TX / RX, % of link peak",
                   f"Each direction as a share of the link's per-direction peak (max generation × width). Healthy "
                   f"below {PCIE[0]:g} %, act above {PCIE[1]:g} % (the rule lowers prefetch, or advises moving the "
                   f"reward model to its own GPU).",
                   [sql(pct_series("pcie_tx_bytes_per_s", " TX")), sql(pct_series("pcie_rx_bytes_per_s", " RX"), "time_series", "B")],
                   "percent", thresholds=bands(*PCIE), max_=100,
                   no_value="unsupported (no PCIe counters or link peak)"),
        timeseries("NVLink TX / RX per GPU (bytes/s, summed over links)",
                   "NVLink traffic per GPU, summed over its links. A GPU without NVLink (or whose NVLink cannot be "
                   "read) has no line, never a zero line: the table below marks it unsupported.",
                   [sql(per_gpu_series(wavg("s.nvlink_tx_bytes_per_s"), "TX", nvlink, " TX",
                                       "s.nvlink_tx_bytes_per_s")),
                    sql(per_gpu_series(wavg("s.nvlink_rx_bytes_per_s"), "RX", nvlink, " RX",
                                       "s.nvlink_rx_bytes_per_s"), ref="B")],
                   "Bps", no_value="unsupported (no NVLink on the selected GPUs)", w=24),
        table("Links per GPU (means over the range)",
              "Each GPU's PCIe link and NVLink, with mean rates over the range. 'unsupported': the GPU reported no "
              "value (no NVLink, or no counter), which trimtab stores as NULL and never as 0.",
              sql(LINKS_SQL, "table"), LINK_COLUMNS,
              overrides=[override(c, unit="Bps", mappings=[unsupported_if_null()])
                         for c in ("PCIe peak", "PCIe TX", "PCIe RX", "NVLink TX", "NVLink RX")]
              + [override(c, mappings=[unsupported_if_null()]) for c in ("PCIe link", "NVLink links")], h=8),
    ]
    return dashboard("trimtab-interconnect", "trimtab · Interconnect",
                     "PCIe and NVLink per GPU: traffic and PCIe use as a share of the link's peak.",
                     [PG_HOST, PG_JOB_FOR_GPUS, PG_GPU], panels, tags=["gpu", "postgresql"])


NVLINK_STAT_PROM = (f"(DCGM_FI_PROF_NVLINK_TX_BYTES{{{SEL}}} + DCGM_FI_PROF_NVLINK_RX_BYTES{{{SEL}}})\n"
                    f"or (DCGM_FI_DEV_GPU_UTIL{{{SEL}}} * 0 - 1)")


def interconnect_prom() -> dict:
    panels = [
        timeseries("PCIe TX / RX per GPU (bytes/s)", "DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES.",
                   [promql(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{SEL}}}", LEGEND + " TX"),
                    promql(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{SEL}}}", LEGEND + " RX", ref="B")],
                   "Bps", no_value="unsupported (no PCIe counters on the selected GPUs)"),
        timeseries("PCIe TX / RX, % of link peak",
                   f"trimtab_gpu_pcie_tx/rx_ratio_of_peak × 100 (trimtab's series: dcgm-exporter does not know the "
                   f"link peak). Healthy below {PCIE[0]:g} %, act above {PCIE[1]:g} %.",
                   [promql(f"100 * trimtab_gpu_pcie_tx_ratio_of_peak{{{SEL}}}", LEGEND + " TX"),
                    promql(f"100 * trimtab_gpu_pcie_rx_ratio_of_peak{{{SEL}}}", LEGEND + " RX", ref="B")],
                   "percent", thresholds=bands(*PCIE), max_=100,
                   no_value="unsupported (no PCIe counters or link peak)"),
        timeseries("NVLink TX / RX per GPU (bytes/s, summed over links)",
                   "DCGM_FI_PROF_NVLINK_TX_BYTES / RX_BYTES. Absent for a GPU without NVLink: no line, not zero.",
                   [promql(f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{SEL}}}", LEGEND + " TX"),
                    promql(f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{SEL}}}", LEGEND + " RX", ref="B")],
                   "Bps", no_value="unsupported (no NVLink on the selected GPUs)", w=24),
        stat("NVLink now (TX + RX) per GPU",
             "NVLink TX + RX per GPU now; 'unsupported' where the GPU reports no NVLink series (the query returns "
             "-1 for a GPU that has utilization but no NVLink series, and -1 is mapped to 'unsupported').",
             [promql(NVLINK_STAT_PROM, LEGEND, instant=True)], "Bps",
             mappings=[{"type": "value", "options": {"-1": {"text": "unsupported", "color": "text", "index": 0}}}],
             w=24, h=5),
    ]
    return dashboard("trimtab-interconnect-prom", "trimtab · Interconnect (Prometheus)",
                     "The Interconnect dashboard's GPU panels on Prometheus.", [PROM_DS, PROM_HOST, PROM_GPU], panels,
                     tags=["gpu", "prometheus"])


# ---------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------

FRAG_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_MATCHES, "max(r.fragmentation) AS frag", " AND r.fragmentation IS NOT NULL")
    + "\n)\n"
    f"SELECT {STEP_BUCKET}, job AS metric, 100 * max(frag) AS \"fragmentation\"\n"
    "FROM steps GROUP BY 1, 2 ORDER BY 1, 2")

OOM_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_MATCHES, "max(r.num_ooms) AS ooms, max(r.num_alloc_retries) AS retries")
    + "\n)\n"
    f"SELECT {STEP_BUCKET}, job AS metric, max(ooms) AS \"OOMs\", max(retries) AS \"allocator retries\"\n"
    "FROM steps WHERE ooms IS NOT NULL OR retries IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2")


def memory_pg() -> dict:
    mem = ["mem_used_bytes", "mem_reserved_bytes"]
    pct = (f"100 * ({wavg('s.mem_used_bytes')} + coalesce({wavg('s.mem_reserved_bytes')}, 0))"
           " / max(g.memory_total_bytes)")
    panels = [
        timeseries("Memory used + reserved, % of total",
                   f"(used by processes + reserved by the driver) / total per GPU. Healthy below {MEMORY[0]:g} %, "
                   f"act above {MEMORY[1]:g} % (the rule halves the batch size).",
                   [sql(per_gpu_series(pct, "% of total", mem, not_null="s.mem_used_bytes"))],
                   "percent", thresholds=bands(*MEMORY), max_=100, no_value="no samples"),
        timeseries("Memory used and reserved per GPU (bytes)",
                   "Framebuffer memory used by processes, and reserved by the driver (NVML memory v2).",
                   [sql(per_gpu_series(wavg("s.mem_used_bytes"), "used", mem, " used", "s.mem_used_bytes")),
                    sql(per_gpu_series(wavg("s.mem_reserved_bytes"), "reserved", mem, " reserved",
                                       "s.mem_reserved_bytes"), ref="B")],
                   "bytes", no_value="no samples"),
        timeseries("Allocator fragmentation per job (worst rank, %)",
                   f"Free memory stranded in split blocks / reserved, from PyTorch's caching allocator via the trainer "
                   f"hook (NVML cannot see it); the worst rank of each step. Healthy below {FRAGMENTATION[0]:g} %, "
                   f"act above {FRAGMENTATION[1]:g} % under memory pressure (batch size down; expandable_segments, "
                   f"bf16, checkpointing).",
                   [sql(FRAG_SQL)], "percent", thresholds=bands(*FRAGMENTATION), max_=100,
                   no_value="no job reports fragmentation"),
        timeseries("OOMs and allocator retries per job (cumulative)",
                   "Out-of-memory errors and cudaMalloc retries since the job started (the highest rank's count), "
                   "from the trainer hook. A step up is a new OOM: the hook halved the batch size.",
                   [sql(OOM_SQL)], "none", no_value="no job reports OOM counts", draw="line"),
    ]
    return dashboard("trimtab-memory", "trimtab · Memory",
                     "GPU memory per GPU, allocator fragmentation and OOMs per job.",
                     [PG_HOST, PG_JOB_FOR_GPUS, PG_GPU], panels, tags=["gpu", "job", "postgresql"])


def memory_prom() -> dict:
    used, reserved, free = (f"DCGM_FI_DEV_FB_{k}{{{SEL}}}" for k in ("USED", "RESERVED", "FREE"))
    panels = [
        timeseries("Memory used + reserved, % of total",
                   f"(FB_USED + FB_RESERVED) / (FB_USED + FB_RESERVED + FB_FREE). Healthy below {MEMORY[0]:g} %, "
                   f"act above {MEMORY[1]:g} %.",
                   [promql(f"100 * ({used} + {reserved})\n  / ({used} + {reserved} + {free})", LEGEND)],
                   "percent", thresholds=bands(*MEMORY), max_=100, no_value="no samples"),
        timeseries("Memory used and reserved per GPU (bytes)", "DCGM_FI_DEV_FB_USED / FB_RESERVED (MiB) in bytes.",
                   [promql(f"{used} * 1048576", LEGEND + " used"),
                    promql(f"{reserved} * 1048576", LEGEND + " reserved", ref="B")], "bytes", no_value="no samples"),
    ]
    return dashboard("trimtab-memory-prom", "trimtab · Memory (Prometheus)",
                     "The Memory dashboard's GPU panels on Prometheus (fragmentation and OOMs come from the trainer "
                     "hook: see the PostgreSQL Memory dashboard).", [PROM_DS, PROM_HOST, PROM_GPU], panels,
                     tags=["gpu", "prometheus"])


# ---------------------------------------------------------------------------------------------------------------
# Job
# ---------------------------------------------------------------------------------------------------------------

THROUGHPUT_TITLE = "Throughput (samples/s, tokens/s)"
STEP_TIME_TITLE = "Step time (s)"

STEP_TIME_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_IS, "max(r.step_time_s) AS step_time_s") + "\n)\n"
    f"SELECT {STEP_BUCKET}, avg(step_time_s) AS \"step time (mean)\", max(step_time_s) AS \"step time (max)\"\n"
    "FROM steps GROUP BY 1 ORDER BY 1")

STEP_CV_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_IS, "max(r.step_time_s) AS step_time_s") + "\n)\n"
    "SELECT avg(step_time_s) AS \"mean step time\",\n"
    "  100 * stddev_samp(step_time_s) / nullif(avg(step_time_s), 0) AS \"step-time variation\",\n"
    "  count(*) AS \"steps\"\nFROM steps")

THROUGHPUT_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_IS, "max(r.step_time_s) AS step_time_s, sum(r.samples) AS samples, "
                                    "sum(r.tokens) AS tokens") + "\n)\n"
    f"SELECT {STEP_BUCKET},\n  sum(samples) / nullif(sum(step_time_s), 0) AS \"samples/s\",\n"
    "  sum(tokens) / nullif(sum(step_time_s), 0) AS \"tokens/s\"\n"
    "FROM steps WHERE samples IS NOT NULL GROUP BY 1 ORDER BY 1")

COMPOSITION_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_IS, "max(r.step_time_s) AS step_time_s, "
                                    + graded_phase_columns(PHASES)) + "\n)\n"
    f"SELECT {STEP_BUCKET},\n"
    + ",\n".join(f"  100 * sum({p}) / nullif(sum(step_time_s), 0) AS \"{p}\"" for p in PHASES) + ",\n"
    "  100 * avg(gpu_timed) AS \"steps on GPU time\""
    + "\nFROM steps GROUP BY 1 ORDER BY 1")

GUIDES_SQL = (
    "WITH steps AS (\n  " + job_steps(JOB_IS, "max(r.step_time_s) AS step_time_s, "
                                    + graded_phase_columns(GUIDES)) + "\n)\n"
    f"SELECT {STEP_BUCKET},\n"
    + ",\n".join(f"  100 * sum({p}) / nullif(sum(step_time_s), 0) AS \"{p}\"" for p in GUIDES) + ",\n"
    + ",\n".join(f"  {v:g} AS \"{p} guide\"" for p, v in GUIDES.items())
    + "\nFROM steps GROUP BY 1 ORDER BY 1")

LATENCY_SQL = (
    "WITH base AS (\n"
    "  SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v) AS baseline FROM (\n"
    "    SELECT r.collective_latency_us AS v FROM job_reports r JOIN jobs j ON j.id = r.job_id\n"
    f"    WHERE {JOB_IS} AND r.collective_latency_us IS NOT NULL\n"
    f"    ORDER BY r.step, r.rank LIMIT {PROBE_BASELINE_STEPS}) AS first_probes\n"
    "), steps AS (\n  "
    + job_steps(JOB_IS, "percentile_cont(0.5) WITHIN GROUP (ORDER BY r.collective_latency_us) AS latency",
                " AND r.collective_latency_us IS NOT NULL") + "\n)\n"
    f"SELECT {STEP_BUCKET}, avg(latency) AS \"latency\", max(baseline) AS \"baseline\",\n"
    f"  {LATENCY[0]:g} * max(baseline) AS \"{LATENCY[0]:g}× baseline\", {LATENCY[1]:g} * max(baseline) AS \"{LATENCY[1]:g}× baseline\"\n"
    "FROM steps CROSS JOIN base GROUP BY 1 ORDER BY 1")

KNOBS_SQL = (
    "SELECT k.knob AS \"knob\", (k.spec ->> 'value')::float8 AS \"value\", (k.spec ->> 'min')::float8 AS \"min\",\n"
    "  (k.spec ->> 'max')::float8 AS \"max\", j.mode AS \"mode\", to_timestamp(j.updated_ms / 1000.0) AS \"updated\"\n"
    "FROM jobs j CROSS JOIN LATERAL json_each(j.knobs) AS k(knob, spec)\n"
    f"WHERE {JOB_IS} ORDER BY 1")

# GPUs by role: the roles the job found (verl: its worker groups), else its typed device_map on its first host.
ROLES_SQL = (
    "SELECT r ->> 'role' AS \"role\", r ->> 'node' AS \"node\",\n"
    "  (SELECT string_agg(g, ',') FROM json_array_elements_text(r -> 'gpus') AS g) AS \"GPUs\",\n"
    "  (SELECT string_agg(p, ',') FROM json_array_elements_text(r -> 'pids') AS p) AS \"worker pids\",\n"
    "  r ->> 'source' AS \"source\"\n"
    "FROM jobs j CROSS JOIN LATERAL json_array_elements(j.roles) AS r\n"
    f"WHERE {JOB_IS} AND j.roles IS NOT NULL\n"
    "UNION ALL\n"
    "SELECT d.role, j.hostnames ->> 0, (SELECT string_agg(g, ',') FROM json_array_elements_text(d.gpus) AS g),\n"
    "  NULL, 'declared'\n"
    "FROM jobs j CROSS JOIN LATERAL json_each(j.device_map) AS d(role, gpus)\n"
    f"WHERE {JOB_IS} AND j.roles IS NULL\n"
    "ORDER BY 1, 2")

KNOB_HISTORY_SQL = (
    "SELECT \"time\", metric, \"value\" FROM (\n"
    "  SELECT c.applied_ms AS \"time\", c.knob AS metric, c.value AS \"value\"\n"
    "  FROM knob_changes c JOIN jobs j ON j.id = c.job_id\n"
    f"  WHERE {JOB_IS} AND c.status = 'applied' AND c.applied_ms BETWEEN $__from AND $__to\n"
    "  UNION ALL\n"
    "  SELECT $__to, k.knob, (k.spec ->> 'value')::float8\n"
    "  FROM jobs j CROSS JOIN LATERAL json_each(j.knobs) AS k(knob, spec)\n"
    f"  WHERE {JOB_IS}\n"
    ") AS points ORDER BY 1, 2")

CHANGES_SQL = (
    "SELECT to_timestamp(c.created_ms / 1000.0) AS \"queued\", c.knob AS \"knob\",\n"
    "  c.previous_value AS \"from\", c.value AS \"to\", c.source AS \"source\", c.status AS \"status\",\n"
    "  c.applied_step AS \"applied at step\", (SELECT count(*) FROM knob_acks a WHERE a.change_id = c.id) AS \"ranks acked\",\n"
    "  c.reason AS \"reason\"\n"
    "FROM knob_changes c JOIN jobs j ON j.id = c.job_id\n"
    f"WHERE {JOB_IS} AND c.created_ms BETWEEN $__from AND $__to\nORDER BY c.created_ms DESC, c.id DESC")

DECISION_ANNOTATION = {
    "name": "Rebalancer decisions", "enable": True, "iconColor": "purple", "datasource": PG,
    "target": {"refId": "Anno", "datasource": PG, "editorMode": "code", "format": "table", "rawQuery": True,
               "rawSql": (
                   "SELECT d.ts_ms AS \"time\",\n"
                   "  d.rule || ': ' || coalesce(d.knob || ' ' || coalesce(d.old_value::text, '?') || ' → '"
                   " || coalesce(d.new_value::text, '?'), 'advice only')\n"
                   "    || ' (' || coalesce(d.outcome, 'no outcome') || ')'"
                   " || coalesce(' — ' || d.advice, '') AS \"text\",\n"
                   "  d.rule || ',' || coalesce(d.outcome, 'none') AS \"tags\"\n"
                   "FROM decisions d JOIN jobs j ON j.id = d.job_id\n"
                   f"WHERE {JOB_IS} AND d.ts_ms BETWEEN $__from AND $__to\nORDER BY 1")},
}


def throughput_panel(w: int = 12) -> dict:
    return timeseries(THROUGHPUT_TITLE,
                      "Samples (and tokens) per second over whole steps: the ranks' samples of each step added up, "
                      "divided by the step's wall time (its slowest rank), as the rebalancer measures before and "
                      "after a change. Purple marks: the rebalancer's decisions.",
                      [sql(THROUGHPUT_SQL)], "short", no_value="no samples reported",
                      overrides=[override("tokens/s", custom__axisPlacement="right")], w=w)


def job_pg() -> dict:
    guides = [override(f"{p} guide", custom__lineStyle={"fill": "dash", "dash": [10, 10]}, color={
        "mode": "fixed", "fixedColor": c}) for p, c in zip(GUIDES, ("blue", "orange", "red"))] + [
        override(p, color={"mode": "fixed", "fixedColor": c}) for p, c in zip(GUIDES, ("blue", "orange", "red"))]
    dashed = {"fill": "dash", "dash": [10, 10]}
    panels = [
        timeseries(STEP_TIME_TITLE, "Wall time per step (its slowest rank): the mean and the longest step in each "
                   "interval.", [sql(STEP_TIME_SQL)], "s", no_value="no step reports"),
        throughput_panel(),
        timeseries("Step composition (% of step time, stacked)",
                   "Where each step's time goes: generation, evaluation (reward, critic, reference), communication, "
                   "update, validation, checkpoint, waiting for rollout, other; each phase its slowest rank's time, "
                   "as a share of the step. On GPU time (the hook's CUDA events) for steps that report it, as "
                   "trimtab check grades them — a phase that launches kernels and returns is charged what the GPU "
                   "did in it; waiting for rollout and host-timed phases stay wall time — on wall time otherwise. "
                   "\"steps on GPU time\": the share of steps graded so (not stacked).",
                   [sql(COMPOSITION_SQL)], "percent", stack=True, max_=100, no_value="no phase timings",
                   overrides=[override("steps on GPU time", custom__stacking={"mode": "none"},
                                       custom__lineStyle={"fill": "dash", "dash": [4, 4]},
                                       custom__fillOpacity=0)]),
        timeseries("Phase shares against the guides",
                   f"Generation, evaluation and communication shares with their guide lines (dashed): generation ≤ "
                   f"{GUIDES['generation']:g} %, evaluation ≤ {GUIDES['evaluation']:g} %, communication ≤ "
                   f"{GUIDES['communication']:g} %. Above its guide a phase bounds the step: generation → batch size "
                   f"up, evaluation → prefetch up, communication → sync less often. On GPU time where the steps "
                   f"report it, as the Step composition panel.",
                   [sql(GUIDES_SQL)], "percent", max_=100, overrides=guides, no_value="no phase timings"),
        timeseries("Collective latency against the job's baseline (µs)",
                   f"The hook's small all-reduce probe (median over ranks per step) with the job's own baseline: "
                   f"the median of its first {PROBE_BASELINE_STEPS} probes. Healthy within "
                   f"{LATENCY[0]:g}× the baseline, act above {LATENCY[1]:g}× (sync less often; check NCCL_ALGO).",
                   [sql(LATENCY_SQL)], "µs", no_value="no latency probes",
                   overrides=[override("baseline", custom__lineStyle=dashed, color={"mode": "fixed", "fixedColor": "green"}),
                              override(f"{LATENCY[0]:g}× baseline", custom__lineStyle=dashed,
                                       color={"mode": "fixed", "fixedColor": "orange"}),
                              override(f"{LATENCY[1]:g}× baseline", custom__lineStyle=dashed,
                                       color={"mode": "fixed", "fixedColor": "red"})]),
        stat("Step-time variation over the range",
             "Mean step time and its coefficient of variation (standard deviation / mean). Aim for "
             "variation below 5 %.", [sql(STEP_CV_SQL, "table")], "none",
             columns=["mean step time", "step-time variation", "steps"], w=12, h=8,
             overrides=[override("mean step time", unit="s", decimals=2),
                        override("step-time variation", unit="percent", decimals=1, thresholds={"mode": "absolute", "steps": [
                                     {"color": "green", "value": None}, {"color": "orange", "value": 5}]},
                                 color={"mode": "thresholds"})]),
        table("GPUs by role", "Which GPUs hold each role (actor, rollout, ref, critic, …) on which node: found by "
              "the job's adapter from its framework's workers (verl: each worker group's Ray actors, with their "
              "pids as NVML lists them), or declared with --device-map. Colocated roles share GPUs.",
              sql(ROLES_SQL, "table"), ["role", "node", "GPUs", "worker pids", "source"], w=12, h=6),
        table("Current knob values", "The job's knobs now, with the bounds it declared and its mode (auto: the "
              "rebalancer changes knobs; advise: it only records advice; off).", sql(KNOBS_SQL, "table"),
              ["knob", "value", "min", "max", "mode", "updated"], w=12, h=6),
        timeseries("Knob values over time", "Each knob's value after every applied change in the range, and now.",
                   [sql(KNOB_HISTORY_SQL)], "none", draw="line", min_=None, w=12, h=6,
                   no_value="no knob values"),
        table("Knob changes", "Changes queued for the job (by the rebalancer or by hand), their state, the step every "
              "rank applied them at, and why.", sql(CHANGES_SQL, "table"),
              ["queued", "knob", "from", "to", "source", "status", "applied at step", "ranks acked", "reason"], h=8),
    ]
    return dashboard("trimtab-job", "trimtab · Job",
                     "One training job: step time, throughput, step composition, collective latency, GPUs by "
                     "role, knobs.",
                     [PG_JOB], panels, annotations=[{**DECISION_ANNOTATION, "_panels": [THROUGHPUT_TITLE]}],
                     tags=["job", "postgresql"])


# ---------------------------------------------------------------------------------------------------------------
# Rebalancer
# ---------------------------------------------------------------------------------------------------------------

DECISIONS_SQL = (
    "SELECT to_timestamp(d.ts_ms / 1000.0) AS \"time\", d.rule AS \"rule\",\n"
    "  coalesce(d.knob || ': ' || coalesce(d.old_value::text, '?') || ' → ' || coalesce(d.new_value::text, '?'),"
    " 'advice only') AS \"change\",\n"
    "  d.applied_step AS \"applied at step\",\n"
    "  d.throughput_before_samples_per_s AS \"before (samples/s)\", d.throughput_after_samples_per_s AS \"after (samples/s)\",\n"
    "  100 * (d.throughput_after_samples_per_s / nullif(d.throughput_before_samples_per_s, 0) - 1) AS \"gain\",\n"
    "  d.outcome AS \"outcome\", d.advice AS \"advice\", d.evidence::text AS \"evidence\"\n"
    "FROM decisions d JOIN jobs j ON j.id = d.job_id\n"
    f"WHERE {JOB_IS} AND d.ts_ms BETWEEN $__from AND $__to\nORDER BY d.ts_ms DESC, d.id DESC")
DECISION_COLUMNS = ["time", "rule", "change", "applied at step", "before (samples/s)", "after (samples/s)", "gain",
                    "outcome", "advice", "evidence"]

OUTCOMES_SQL = (
    "SELECT coalesce(d.outcome, 'none') AS \"outcome\", count(*) AS \"decisions\"\n"
    "FROM decisions d JOIN jobs j ON j.id = d.job_id\n"
    f"WHERE {JOB_IS} AND d.ts_ms BETWEEN $__from AND $__to\nGROUP BY 1 ORDER BY 1")


def rebalancer_pg() -> dict:
    panels = [
        throughput_panel(w=16),
        stat("Decisions by outcome", "How the rebalancer's decisions in the range turned out: kept (throughput "
             "rose), rolled back (it did not), pending (being measured), advised (advice only, no change).",
             [sql(OUTCOMES_SQL, "table")], "none", columns=["outcome", "decisions"], w=8, h=8,
             display_name="${__data.fields.outcome}"),
        table("Decisions", "Every decision in the range: the rule that fired, its evidence (the window it judged), "
              "the knob change it made (old → new) and the step it took effect at, throughput over the window "
              "before and after, and the outcome. Advice-only decisions change nothing.",
              sql(DECISIONS_SQL, "table"), DECISION_COLUMNS, h=12,
              overrides=[override("outcome", mappings=OUTCOME_MAPPINGS,
                                  custom__cellOptions={"type": "color-text"}),
                         override("gain", unit="percent", decimals=1),
                         override("evidence", custom__inspect=True, custom__width=400),
                         override("advice", custom__inspect=True)]),
    ]
    return dashboard("trimtab-rebalancer", "trimtab · Rebalancer",
                     "What the rebalancer decided for one job, why, and whether it helped.",
                     [PG_JOB], panels, annotations=[{**DECISION_ANNOTATION, "_panels": [THROUGHPUT_TITLE]}],
                     tags=["job", "postgresql"])


DASHBOARDS = {
    "balance.json": balance_pg, "balance-prometheus.json": balance_prom,
    "interconnect.json": interconnect_pg, "interconnect-prometheus.json": interconnect_prom,
    "memory.json": memory_pg, "memory-prometheus.json": memory_prom,
    "job.json": job_pg, "rebalancer.json": rebalancer_pg,
}


def render(build) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    DASHBOARD_DIR.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        path, text = DASHBOARD_DIR / name, render(build)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale (run python3 grafana/generate.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
