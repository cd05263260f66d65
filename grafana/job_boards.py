"""The job dashboards (Job, Rebalancer), on PostgreSQL: a job's steps folded as the rebalancer folds them, its
knobs and the rebalancer's decisions. ``grafana.generate`` writes them."""

from __future__ import annotations

from grafana.ledger_panels import ledger_pg_panels
from trimtab.grading.rules import load_rules
from grafana.panels import (GUIDES, JOB_IS, LATENCY, OUTCOME_MAPPINGS, PG, PG_JOB, PHASES, PROBE_BASELINE_STEPS,
                            STEP_BUCKET, dashboard, graded_phase_columns, job_steps, override, sql, stat, table,
                            timeseries)

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
        *ledger_pg_panels(),
    ]
    return dashboard("trimtab-job", "trimtab · Job",
                     "One training job: step time, throughput, step composition, collective latency, GPUs by "
                     "role, knobs, and where its GPU time went (the GPU-time ledger).",
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

# Decisions on a knob that changes what is learned (the shipped rules' [learning] changes_learning: prefetch,
# sync_every), with both verdicts in words as control/goodput.py stored them and trimtab check prints them; advice-only
# moves of such a knob for a job reporting no learning signal say so in their advice.
LEARNING_KNOBS = load_rules().learning.changes_learning
LEARNING_SQL = (
    "SELECT to_timestamp(d.ts_ms / 1000.0) AS \"time\",\n"
    "  d.knob || ': ' || coalesce(d.old_value::text, '?') || ' → ' || coalesce(d.new_value::text, '?') AS \"change\",\n"
    "  d.outcome AS \"outcome\",\n"
    "  coalesce(d.evidence -> 'verdicts' ->> 'throughput', CASE d.outcome WHEN 'pending' THEN 'being measured' "
    "WHEN 'advised' THEN 'not made' ELSE 'not recorded' END) AS \"throughput verdict\",\n"
    "  coalesce(d.evidence -> 'verdicts' ->> 'learning', CASE WHEN d.advice LIKE '%reports no learning signal%' "
    "THEN 'no learning signal reported: advice only' WHEN d.outcome = 'pending' THEN 'being measured' "
    "ELSE 'not recorded' END) AS \"learning verdict\",\n"
    "  d.evidence -> 'learning_broken' ->> 'signal' AS \"signal\"\n"
    "FROM decisions d JOIN jobs j ON j.id = d.job_id\n"
    f"WHERE {JOB_IS} AND d.ts_ms BETWEEN $__from AND $__to\n"
    f"  AND (d.knob IN ({', '.join(repr(k) for k in LEARNING_KNOBS)}) OR d.evidence -> 'verdicts' IS NOT NULL)\n"
    "ORDER BY d.ts_ms DESC, d.id DESC")
LEARNING_COLUMNS = ["time", "change", "outcome", "throughput verdict", "learning verdict", "signal"]

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
        table("Learning-knob decisions: both verdicts",
              "Changes to a knob that changes what is learned (prefetch, sync_every): kept only if throughput "
              "improved and the learning guards held. Each row: the throughput verdict (gain and how sure) and the "
              "learning verdict (held: each signal before → after; broke: the signal and the bound it broke, the "
              "change rolled back at once), as trimtab check prints them. A job that reports no learning signal "
              "gets advice only on these knobs (rules.toml [learning] without_signals).",
              sql(LEARNING_SQL, "table"), LEARNING_COLUMNS, h=8,
              overrides=[override("outcome", mappings=OUTCOME_MAPPINGS, custom__cellOptions={"type": "color-text"}),
                         override("learning verdict", custom__inspect=True, custom__width=420)]),
    ]
    return dashboard("trimtab-rebalancer", "trimtab · Rebalancer",
                     "What the rebalancer decided for one job, why, and whether it helped.",
                     [PG_JOB], panels, annotations=[{**DECISION_ANNOTATION, "_panels": [THROUGHPUT_TITLE]}],
                     tags=["job", "postgresql"])
