"""What ``bench/multigpu_pipeline.py`` reads from its ranks and the daemon, and prints — no torch, no daemon, so
``tests/workload/test_pipeline_ddp.py`` tests it: the knob grid, per-rank steps combined into the job's, throughput,
the knob path, acknowledgement and probe rows, the GPU busy spread, and the summary tables.
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Iterable, Mapping, Optional, Sequence

DEFAULTS = (1, 0, 1)
PROBE_BASELINE_N = 5  # rules.toml probe_baseline_steps: the server's baseline = median of the job's first 5 probes


def parse_grid(text: str) -> list[tuple[int, int, int]]:
    """``'64,2,4;16,2,1'`` → [(64, 2, 4), (16, 2, 1)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        b, p, s = (int(x) for x in part.split(","))
        out.append((b, p, s))
    return out


def knobs_dict(t: Sequence[int]) -> dict:
    return {"batch_size": int(t[0]), "prefetch": int(t[1]), "sync_every": int(t[2])}


def knob_tuple(record: Mapping) -> tuple[int, int, int]:
    return (record["batch_size"], record["prefetch"], record["sync_every"])


def combine_ranks(per_rank: Sequence[Sequence[Mapping]]) -> list[dict]:
    """The ranks' records of one phase, step by step: samples summed, the slowest rank's step time (the job waits
    for it; the gradient all-reduce keeps ranks in lockstep), knobs as on rank 0 (agreed on every rank)."""
    lengths = {len(records) for records in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks ran different step counts: {sorted(lengths)}")
    out = []
    for rows in zip(*per_rank):
        knobs = {knob_tuple(r) for r in rows}
        out.append({"step": rows[0]["step"], "samples": sum(r["samples"] for r in rows),
                    "step_s": max(r["step_s"] for r in rows), "knobs": knob_tuple(rows[0]),
                    "knobs_agree": len(knobs) == 1})
    return out


def throughput(steps: Sequence[Mapping]) -> Optional[float]:
    seconds = sum(s["step_s"] for s in steps)
    return sum(s["samples"] for s in steps) / seconds if steps and seconds > 0 else None


def steps_to_within(steps: Sequence[Mapping], reference: float, fraction: float = 0.95, smooth: int = 3):
    for end in range(smooth, len(steps) + 1):
        tp = throughput(steps[end - smooth:end])
        if tp is not None and tp >= fraction * reference:
            return end - 1
    return None


def knob_path(steps: Sequence[Mapping]) -> str:
    runs: list[list] = []
    for s in steps:
        if not runs or runs[-1][0] != tuple(s["knobs"]):
            runs.append([tuple(s["knobs"]), 0])
        runs[-1][1] += 1
    return " → ".join(f"{k[0]}/{k[1]}/{k[2]} ({n} steps)" for k, n in runs)


def ack_rows(changes: Sequence[Mapping], world: int) -> list[dict]:
    """One row per change (oldest first): the step each rank acknowledged, and whether all ranks agree with the
    change's applied step."""
    rows = []
    for c in sorted(changes, key=lambda c: c["change_id"]):
        by_rank = {a["rank"]: a["applied_at_step"] for a in c.get("acks", [])}
        steps = [by_rank.get(r) for r in range(world)]
        same = all(s is not None for s in steps) and len(set(steps)) == 1 and steps[0] == c.get("applied_step")
        rows.append({"change_id": c["change_id"], "knob": c["knob"], "value": c["value"], "status": c["status"],
                     "applied_step": c.get("applied_step"), "acks": steps, "all_ranks_same_step": same})
    return rows


def probe_rows(reports: Iterable[Mapping], world: int) -> list[dict]:
    """Per step (ascending): each rank's probe latency (µs, None where that step had none) and their median."""
    by_step: dict[int, dict[int, float]] = {}
    for r in reports:
        if r.get("collective_latency_us") is not None:
            by_step.setdefault(r["step"], {})[r["rank"]] = r["collective_latency_us"]
    rows = []
    for step in sorted(by_step):
        values = [by_step[step].get(rank) for rank in range(world)]
        known = [v for v in values if v is not None]
        rows.append({"step": step, "per_rank_us": values, "median_us": statistics.median(known)})
    return rows


def server_baseline(reports: Iterable[Mapping], n: int = PROBE_BASELINE_N) -> Optional[float]:
    """As the rebalancer computes it: the median of the job's first ``n`` probes ordered by (step, rank)."""
    probes = sorted((r["step"], r["rank"], r["collective_latency_us"]) for r in reports
                    if r.get("collective_latency_us") is not None)
    return statistics.median(p[2] for p in probes[:n]) if n > 0 and len(probes) >= n else None


def busy_spread(busy: Mapping[int, Optional[float]], gpus: Iterable[int]) -> Optional[float]:
    values = [busy.get(g) for g in gpus]
    if not values or any(v is None for v in values):
        return None
    return max(values) - min(values)


def fmt(v: Optional[float], spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (what BENCHMARKS.md holds)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def phase_steps(ranks: Sequence[Mapping], name: str, occurrence: int = 0) -> tuple[list[dict], float, float]:
    """Combined steps of the ``occurrence``-th phase called ``name``, and its wall window (earliest start,
    latest end over ranks)."""
    per_rank, starts, ends = [], [], []
    for r in ranks:
        phases = [p for p in r["phases"] if p["name"] == name]
        p = phases[occurrence]
        per_rank.append(p["records"])
        starts.append(p["start"])
        ends.append(p["end"])
    return combine_ranks(per_rank), min(starts), max(ends)


def summarize(args, ranks, world, grid, changes, reports, decisions, proposal, placement_ranks, busy_final,
              busy_placed, declared, simulated, wall_s: float) -> dict:
    sim = " (SIMULATED node: agent figures are synthetic)" if simulated else ""
    print(f"\n## Static grid (job throughput = samples of all {world} ranks / slowest rank's step time)")
    grid_tp = []
    for i, k in enumerate(grid):
        steps, _, _ = phase_steps(ranks, "static", i)
        grid_tp.append(throughput(steps) or 0.0)
    rows = []
    for i, k in enumerate(grid):
        per_rank = [throughput([{"samples": r["samples"], "step_s": r["step_s"]} for r in rk["phases"][i]["records"]])
                    for rk in ranks]
        rows.append([f"{k[0]},{k[1]},{k[2]}", fmt(grid_tp[i]), " / ".join(fmt(v) for v in per_rank)])
    print(table(["setting", "job samples/s", "per rank samples/s"], rows))

    auto = combine_ranks([r["auto"]["records"] for r in ranks]) if "auto" in ranks[0] else []
    best_i = ranks[0].get("best_index")
    best_before = grid_tp[best_i] if best_i is not None else (max(grid_tp) if grid_tp else None)
    best_after = throughput(phase_steps(ranks, "best again")[0]) if best_i is not None else None
    best = (best_before + best_after) / 2 if best_before and best_after else best_before
    final_tp = throughput(phase_steps(ranks, "final knobs")[0]) if any(
        p["name"] == "final knobs" for p in ranks[0]["phases"]) else None
    defaults = [s for s in auto if tuple(s["knobs"]) == DEFAULTS]
    default_tp = throughput(defaults)
    tail = auto[-args.tail:]
    reached = throughput(tail)
    within = steps_to_within(auto, best) if best else None

    print(f"\n## Auto run: {len(auto)} steps, {ranks[0]['auto']['stopped_because'] if auto else 'not run'}")
    print("knob path: " + knob_path(auto))
    print(f"knobs identical on every rank at every step: {all(s['knobs_agree'] for s in auto)}")
    print("\ndecisions (oldest first):")
    drow = []
    for d in reversed(decisions):
        change = f"{d['knob']} {d['old_value']} → {d['new_value']}" if d["knob"] else "advice"
        gain = (d.get("evidence") or {}).get("gain_pct")
        drow.append([d["id"], d["rule"], change, d.get("applied_step"), fmt(d.get("throughput_before_samples_per_s")),
                     fmt(d.get("throughput_after_samples_per_s")), "" if gain is None else f"{gain:+.1f} %",
                     d["outcome"], "yes" if (d.get("evidence") or {}).get("placement") else ""])
    print(table(["id", "rule", "change", "applied at step", "before samples/s", "after samples/s", "gain", "outcome",
                 "placement"], drow))
    acks = ack_rows(changes, world)
    print("\nacknowledgements (GET /v1/jobs/{job}/changes):")
    print(table(["change", "knob → value", "status", "applied step"] + [f"rank {r} ack step" for r in range(world)]
                + ["all ranks same step"],
                [[a["change_id"], f"{a['knob']} → {a['value']}", a["status"], a["applied_step"], *a["acks"],
                  "yes" if a["all_ranks_same_step"] else "NO"] for a in acks]))

    print(f"\n## Throughput: best static {fmt(best)} samples/s (before {fmt(best_before)}, after {fmt(best_after)}); "
          f"defaults {fmt(default_tp)} ({len(defaults)} auto steps at 1/0/1); auto reached {fmt(reached)} over its "
          f"last {len(tail)} steps = {fmt(100 * reached / best if reached and best else None, '.1f')} % of best "
          f"(goal ≥ 95 %), {fmt(reached / default_tp if reached and default_tp else None, '.1f')}× the defaults; "
          f"within 5 % of best from auto step {within}; final knobs measured static: {fmt(final_tp)} samples/s")

    probes = probe_rows(reports, world)
    base = server_baseline(reports)
    hook_bases = [r.get("auto", {}).get("hook_stats", {}).get("collective_baseline_us") for r in ranks]
    print(f"\n## Collective-latency probe (small all-reduce, every {args.probe_every} step(s)): baseline "
          f"{fmt(base, '.1f')} µs (server: median of the first {PROBE_BASELINE_N} probes); per-rank hook baselines "
          f"{' / '.join(fmt(b, '.1f') for b in hook_bases)} µs")
    print(table(["step"] + [f"rank {r} µs" for r in range(world)] + ["median µs", "× baseline"],
                [[p["step"], *(fmt(v, ".1f") for v in p["per_rank_us"]), fmt(p["median_us"], ".1f"),
                  fmt(p["median_us"] / base if base else None, ".2f")] for p in probes]))

    print("\n## Placement advice" + sim)
    placed_tp = None
    if proposal is None:
        print("no decision carried a placement proposal (the utilization-balance rule did not fire with a better map)")
    else:
        print(f"proposed device_map {proposal['device_map']} (declared {declared})")
        for m in proposal.get("moves", []):
            print(f"  - {m}")
        print(f"  expected busy spread {proposal.get('expected_spread_pts_before')} → "
              f"{proposal.get('expected_spread_pts_after')} points; {proposal.get('expected_effect', '')}")
        if placement_ranks is not None:
            placed_tp = throughput(phase_steps(placement_ranks, "static")[0])
            gpus = sorted({g for idx in declared.values() for g in idx} | {g for idx in proposal["device_map"].values()
                                                                           for g in idx})
            print(table(["run", "job samples/s"] + [f"GPU {g} busy %" for g in gpus] + ["spread pts"],
                        [["original map, final knobs", fmt(final_tp), *(fmt((busy_final or {}).get(g), ".1f")
                                                                        for g in gpus),
                          fmt(busy_spread(busy_final or {}, gpus), ".1f")],
                         ["proposed map, final knobs", fmt(placed_tp), *(fmt((busy_placed or {}).get(g), ".1f")
                                                                         for g in gpus),
                          fmt(busy_spread(busy_placed or {}, gpus), ".1f")]]))
            if final_tp and placed_tp:
                print(f"measured effect: {100 * (placed_tp / final_tp - 1):+.1f} % samples/s")
    grads = [r["grads"] for r in ranks]
    digests = {r["actor_digest"] for r in ranks}
    print(f"\nreplicas identical at the end: {len(digests) == 1}; gradient all-reduces per rank "
          f"{grads[0]['reductions']} ({grads[0]['bytes_reduced'] / 2**30:.2f} GiB), late flushes "
          f"{sum(g['late_flushes'] for g in grads)}; wall {wall_s:.0f} s")
    summary = {"world": world, "config": args.config, "grid": {f"{k[0]},{k[1]},{k[2]}": round(t, 3)
                                                              for k, t in zip(grid, grid_tp)},
               "best_static": best, "defaults": default_tp, "reached": reached, "steps_to_within_5pct": within,
               "final_knobs": ranks[0].get("auto", {}).get("final_knobs"), "final_static": final_tp,
               "acks_all_same_step": all(a["all_ranks_same_step"] for a in acks if a["status"] == "applied"),
               "changes": len(acks), "probe_baseline_us": base, "probe_steps": len(probes),
               "placement": proposal, "placement_samples_per_s": placed_tp, "replicas_identical": len(digests) == 1,
               "simulated_node": simulated}
    print(json.dumps({k: v for k, v in summary.items() if k != "placement"}, default=str))
    return summary
