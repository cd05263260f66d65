"""The node dashboards (Balance, Interconnect, Memory), each on PostgreSQL and on Prometheus: the GPU panels that
read the store's samples and rollups, or dcgm-exporter's and trimtab's series. ``grafana.generate`` writes them."""

from __future__ import annotations

from grafana.ledger_panels import ledger_prom_panels
from grafana.panels import (BUCKET, FRAGMENTATION, GPU_IDS, GPU_LABEL, JOB_MATCHES, LEGEND, MEMORY, NVLINK_RX,
                            NVLINK_TX, PCIE, PCIE_RX, PCIE_TX, PG_GPU, PG_HOST, PG_JOB_FOR_GPUS, PROM_DS, PROM_GPU,
                            PROM_HOST, SM_ACTIVE_PCT, SPREAD, STATUS_MAPPINGS, STEP_BUCKET, TRIMTAB_SEL, UTIL_PCT,
                            VERDICT_WINDOW_MS, bands, dashboard, dcgm, fb_bytes, gpu_source, job_steps, override,
                            per_gpu_series, promql, sql, stat, table, timeseries, unsupported_if_null, wavg)

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
    f"(max by (hostname) ({SM_ACTIVE_PCT}) - min by (hostname) ({SM_ACTIVE_PCT}))\n"
    f"  and on (hostname) (count by (hostname) ({SM_ACTIVE_PCT}) == count by (hostname) ({UTIL_PCT}))\n"
    f"or\n(max by (hostname) ({UTIL_PCT}) - min by (hostname) ({UTIL_PCT}))")
GENERATIONS_NOTE = ("Either dcgm-exporter generation: the current names (4.10) or the legacy ones (up to 4.8.2, "
                    "label Hostname), each in this panel's unit.")


def balance_prom() -> dict:
    panels = [
        timeseries("Utilization per GPU (NVML, %)", "DCGM_FI_DEV_GPU_UTIL_RATIO × 100 (legacy DCGM_FI_DEV_GPU_UTIL, "
                   f"already %): kernel-busy utilization. {GENERATIONS_NOTE}",
                   [promql(UTIL_PCT, LEGEND)], "percent", max_=100, no_value="no samples"),
        timeseries("SM activity per GPU (GPM, %)", "DCGM_FI_PROF_SM_UTIL_RATIO (legacy DCGM_FI_PROF_SM_ACTIVE) × 100: "
                   f"the share of SMs busy. {GENERATIONS_NOTE}",
                   [promql(SM_ACTIVE_PCT, LEGEND)], "percent", max_=100,
                   no_value="unsupported (no SM activity on the selected GPUs)"),
        timeseries("Utilization spread (max − min across GPUs, points)",
                   f"Per node: SM activity spread when every selected GPU reports SM activity, else utilization "
                   f"spread. Healthy below {SPREAD[0]:g} points, act above {SPREAD[1]:g}.",
                   [promql(SPREAD_PROM, "{{hostname}}")], "none", thresholds=bands(*SPREAD), w=24),
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
        *ledger_prom_panels(),
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


NVLINK_STAT_PROM = f"({dcgm(NVLINK_TX)} + {dcgm(NVLINK_RX)})\nor ({UTIL_PCT} * 0 - 1)"


def interconnect_prom() -> dict:
    panels = [
        timeseries("PCIe TX / RX per GPU (bytes/s)", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND / RX_BYTES_PER_SECOND "
                   f"(up to 4.9: DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES, also bytes/s). {GENERATIONS_NOTE}",
                   [promql(dcgm(PCIE_TX), LEGEND + " TX"), promql(dcgm(PCIE_RX), LEGEND + " RX", ref="B")],
                   "Bps", no_value="unsupported (no PCIe counters on the selected GPUs)"),
        timeseries("PCIe TX / RX, % of link peak",
                   f"trimtab_gpu_pcie_tx/rx_ratio_of_peak × 100 (trimtab's series: dcgm-exporter does not know the "
                   f"link peak). Healthy below {PCIE[0]:g} %, act above {PCIE[1]:g} %.",
                   [promql(f"100 * trimtab_gpu_pcie_tx_ratio_of_peak{{{TRIMTAB_SEL}}}", LEGEND + " TX"),
                    promql(f"100 * trimtab_gpu_pcie_rx_ratio_of_peak{{{TRIMTAB_SEL}}}", LEGEND + " RX", ref="B")],
                   "percent", thresholds=bands(*PCIE), max_=100,
                   no_value="unsupported (no PCIe counters or link peak)"),
        timeseries("NVLink TX / RX per GPU (bytes/s, summed over links)",
                   "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND / RX_BYTES_PER_SECOND (up to 4.9: "
                   "DCGM_FI_PROF_NVLINK_TX_BYTES / RX_BYTES, also bytes/s). Absent for a GPU without NVLink: no "
                   f"line, not zero. {GENERATIONS_NOTE}",
                   [promql(dcgm(NVLINK_TX), LEGEND + " TX"), promql(dcgm(NVLINK_RX), LEGEND + " RX", ref="B")],
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
    used, reserved, free = (fb_bytes(k) for k in ("USED", "RESERVED", "FREE"))
    panels = [
        timeseries("Memory used + reserved, % of total",
                   f"(FB_USED + FB_RESERVED) / (FB_USED + FB_RESERVED + FB_FREE), from DCGM_FI_DEV_FB_*_BYTES "
                   f"(legacy: DCGM_FI_DEV_FB_* in MiB). Healthy below {MEMORY[0]:g} %, act above {MEMORY[1]:g} %. "
                   f"{GENERATIONS_NOTE}",
                   [promql(f"100 * ({used} + {reserved})\n  / ({used} + {reserved} + {free})", LEGEND)],
                   "percent", thresholds=bands(*MEMORY), max_=100, no_value="no samples"),
        timeseries("Memory used and reserved per GPU (bytes)",
                   "DCGM_FI_DEV_FB_USED_BYTES / FB_RESERVED_BYTES (legacy: DCGM_FI_DEV_FB_USED / FB_RESERVED in MiB, "
                   f"× 1048576). {GENERATIONS_NOTE}",
                   [promql(used, LEGEND + " used"), promql(reserved, LEGEND + " reserved", ref="B")], "bytes",
                   no_value="no samples"),
    ]
    return dashboard("trimtab-memory-prom", "trimtab · Memory (Prometheus)",
                     "The Memory dashboard's GPU panels on Prometheus (fragmentation and OOMs come from the trainer "
                     "hook: see the PostgreSQL Memory dashboard).", [PROM_DS, PROM_HOST, PROM_GPU], panels,
                     tags=["gpu", "prometheus"])
