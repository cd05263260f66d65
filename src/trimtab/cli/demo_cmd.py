"""`trimtab demo`: the closed loop on this machine's CPU in about two minutes — the first thing to run after installing.

It starts a real `trimtab up` (simulated node when there is no NVIDIA driver) on a free loopback port with its own
state directory, runs the reference PPO pipeline (``demo`` config: tiny models, CPU, one-step off-policy) at
deliberately bad settings for a few steps, then hands it to the rebalancer in ``auto`` mode until the rebalancer
has had nothing to change for a few steps, and measures the settings it left with the job switched to ``advise``.
It prints throughput before and after, the knob path and every decision with its evidence, its verdict and, for a
change rolled back, what the pipeline itself counted. Needs the `[trainer]` extra (torch).
"""

from __future__ import annotations

import importlib
import json
import sys
import time

import click

from trimtab.contract.statuses import KEPT, ROLLED_BACK

KNOBS = ("batch_size", "prefetch", "sync_every")
CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"  # as the README says


def _fmt(value, unit: str = "") -> str:
    return "–" if value is None else f"{value:,.1f}{unit}"


def _knobs_text(knobs) -> str:
    return ", ".join(f"{name} {value}" for name, value in zip(KNOBS, knobs))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the readable report.")
@click.option("--budget", "budget_s", type=click.FloatRange(10, 3600), default=120.0, show_default=True,
              metavar="SECONDS", help="Longest the rebalanced run may take.")
@click.option("--quiet-steps", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Hand over to the 'after' measurement once the rebalancer had nothing to change for this many "
                   "steps in a row.")
@click.option("--after-steps", type=click.IntRange(2, 1000), default=20, show_default=True,
              help="Steps measured at the settings the rebalancer left (the job switched to mode advise: nothing new "
                   "is tried).")
@click.option("--before-steps", type=click.IntRange(2, 1000), default=4, show_default=True,
              help="Steps measured at the bad defaults (after one warm-up step).")
@click.option("--keep-state", is_flag=True, help="Keep the demo daemon's state directory (store, log) afterwards.")
def demo(as_json: bool, budget_s: float, quiet_steps: int, after_steps: int, before_steps: int,
         keep_state: bool) -> None:
    """Watch the rebalancer fix a badly configured PPO job on this CPU (about 50 s on 2 CPU cores).

    Starts a private `trimtab up` on a free loopback port, runs the reference pipeline from deliberately bad
    settings (batch 1, no prefetch, sync every step), lets the rebalancer change its knobs in `auto` mode — raise
    the batch size, let generation run ahead (prefetch), roll back what measured worse — and prints throughput
    before and after with every decision it took and why. The header's before/after are the steps before the
    hand-off and the --after-steps steps at the final settings; each decision's figures are the rebalancer's own
    windows around that change. Nothing outside a temporary directory is touched.
    """
    try:
        importlib.import_module("torch")  # the demo's workload needs it: say how to install it, here

        from trimtab.trainer import attach
        from trimtab.workload import story
        from trimtab.workload.config import parse_device_map, preset
        from trimtab.workload.loop import Pipeline, set_cpu_threads
    except ImportError as exc:
        raise click.ClickException(f"demo needs the trainer extra: pip install '.[trainer]' in trimtab's checkout; "
                                   f"without a GPU install the CPU build of torch first, {CPU_TORCH} ({exc})") from exc

    def say(msg: str) -> None:
        click.echo(msg, err=as_json)

    config = preset("demo")
    devices = parse_device_map("cpu")
    set_cpu_threads(devices)
    say("starting a private `trimtab up` …")
    try:
        daemon = story.start_daemon(args=["--interval", "1"])
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    job = f"demo-{int(time.time())}"
    started = time.monotonic()
    try:
        health = story.api_get(daemon, "/healthz")
        node = "a SIMULATED node (no NVIDIA driver here)" if health.get("simulated") else "this node's GPUs (NVML)"
        say(f"daemon at {daemon.url}, watching {node}; state in {daemon.state_dir}")
        say(f"pipeline: {config.name} config on the CPU ({config.samples_per_step} samples/step, "
            f"{config.prompt_tokens}+{config.response_tokens} tokens; one-step off-policy: a batch sampled more than "
            f"{config.max_staleness} update before it is trained on is sampled again)")
        defaults = story.default_knobs()
        with Pipeline(config, devices, knobs=dict(defaults)) as pipe:
            before_tp, before = story.measure_static(pipe, defaults, warmup=1, steps=before_steps)
            say(f"before: {before_tp:,.1f} samples/s at {_knobs_text(story.knob_tuple(before[-1]))} "
                f"({len(before)} steps)")
            say("handing the job to the rebalancer (mode auto); one line per change it makes, with the throughput it "
                "measured over its own windows of steps (as the decisions below) …")
            hook = attach(job=job, server=daemon.url, token=daemon.token, device_map=devices.as_hook_map(),
                          knobs=story.declaration(defaults, config), mode="auto")
            progress = _progress(say, daemon, job, story.knob_tuple(before[-1]))
            idle = story.rebalancer_idle(daemon, job)
            run = story.run_auto(pipe, hook, max_steps=100_000, budget_s=budget_s, tail_steps=quiet_steps,
                                 show=progress, settled=idle)
            say(f"{run.stopped_because} (rebalancer: {idle.note or 'no note'});\n  holding these knobs "
                f"(job mode advise: nothing new is tried) for {after_steps} steps to measure them …")
            after = story.hold(daemon, job, pipe, after_steps, show=progress)
            hook.close()
        decisions = list(reversed(story.api_get(daemon, f"/v1/decisions?job={job}&limit=200")["decisions"]))
        job_out = story.api_get(daemon, f"/v1/jobs/{job}")
        changes = list(reversed(story.api_get(daemon, f"/v1/jobs/{job}/changes?limit=200")["changes"]))
    finally:
        daemon.close(keep_state)
    records = run.records + after
    after_tp = story.throughput(after) or 0.0
    final = dict(zip(KNOBS, story.knob_tuple(after[-1])))
    bounds_ok = all(job_out["knobs"][k]["min"] <= v <= job_out["knobs"][k]["max"] for k, v in final.items())
    result = {
        "job": job, "config": config.name, "device": "cpu", "simulated_node": bool(health.get("simulated")),
        "before_samples_per_s": round(before_tp, 2), "after_samples_per_s": round(after_tp, 2),
        "speedup": round(after_tp / before_tp, 2) if before_tp else None,
        "knobs_before": defaults, "knobs_after": final, "within_bounds": bounds_ok,
        "auto_steps": len(run.records), "after_steps": len(after), "stopped_because": run.stopped_because,
        "rebalancer_note": idle.note, "seconds": round(time.monotonic() - started, 1),
        "changes": [{k: c[k] for k in ("change_id", "knob", "value", "previous_value", "source", "status",
                                       "applied_step", "reason")} for c in changes],
        "decisions": [_decision_row(d, records) for d in decisions],
    }
    result["story"] = _story(result["decisions"])
    if as_json:
        click.echo(json.dumps(result))
        return
    _print_report(result, before_tp, after_tp, len(before), decisions, records)
    if not bounds_ok:  # never expected: the hook and the controller both clamp
        click.echo("warning: a knob ended outside its declared bounds", err=True)
        sys.exit(1)


def _progress(say, daemon, job: str, start: tuple):
    """One line per knob change, with the rebalancer's own figures — the windows of steps its decisions and verdicts
    are measured over (a single step's rate right after a change is no measure: a deeper prefetch starts on batches
    already generated, so its first steps run fast whatever the verdict will be)."""
    from trimtab.workload import story

    last = [start]

    def show(record) -> None:
        knobs = story.knob_tuple(record)
        if knobs == last[0]:
            return
        moved = [(name, old, new) for name, old, new in zip(KNOBS, last[0], knobs) if old != new]
        last[0] = knobs
        try:
            changes = story.api_get(daemon, f"/v1/jobs/{job}/changes?limit=5")["changes"]
            decisions = story.api_get(daemon, f"/v1/decisions?job={job}&limit=20")["decisions"]
        except Exception:
            changes, decisions = [], []
        say(f"  step {record.step:4d}: {_change_line(moved, changes, decisions)}")
    return show


def _change_line(moved, changes: list, decisions: list) -> str:
    """``batch_size 16 → 64 (generation_bound at 117.6 samples/s over steps 17–24)``, or for a rollback the verdict's
    before → after; the knobs alone where the API had nothing to match (a manual change)."""
    what = ", ".join(f"{name} {old} → {new}" for name, old, new in moved)
    name, _, new = moved[-1]
    change = next((c for c in changes if c["knob"] == name and c["value"] == new), None)
    if change is None:
        return what
    if change["reason"].startswith("rollback:"):
        d = next((d for d in decisions if d["outcome"] == ROLLED_BACK and d["knob"] == name), None)
        if d is None:
            return f"{what}, rolled back"
        v = d["evidence"].get("verdict") or {}
        if not v:
            return f"{what}, rolled back (decision #{d['id']})"
        said = "not told apart from noise and no better" if d["evidence"].get("back_to_known") else "worse"
        return (f"{what}, rolled back on decision #{d['id']}'s verdict: {100 * (v['ratio'] - 1):+.1f} % "
                f"({v['confidence_pct']:.0f} % sure), {said}")
    d = next((d for d in decisions if d["change_id"] == change["change_id"]), None)
    if d is None:
        return what
    steps = (d["evidence"].get("window") or {}).get("steps")
    over = "" if not steps else f" over step {steps[0]}" if steps[0] == steps[1] else f" over steps {steps[0]}–{steps[1]}"
    return f"{what} (decision #{d['id']}, {d['rule']}, at {_fmt(d['throughput_before_samples_per_s'])} samples/s{over})"


def _regenerated(d: dict, records) -> tuple[int, int]:
    """(samples generated twice, samples) over the decision's after window, from the pipeline's own records."""
    steps = (d["evidence"].get("after_window") or {}).get("steps")
    if not steps:
        return 0, 0
    inside = [r for r in records if steps[0] <= r.step <= steps[1]]
    return sum(r.regenerated for r in inside), sum(r.samples for r in inside)


def _decision_row(d: dict, records) -> dict:
    row = {k: d[k] for k in ("id", "rule", "change_id", "knob", "old_value", "new_value", "applied_step",
                             "throughput_before_samples_per_s", "throughput_after_samples_per_s", "outcome", "advice")}
    regenerated, samples = _regenerated(d, records)
    ev = d["evidence"]
    return row | {"gain_pct": ev.get("gain_pct"), "verdict": ev.get("verdict"), "no_gain": bool(ev.get("no_gain")),
                  "back_to_known": bool(ev.get("back_to_known")), "remeasure": bool(ev.get("remeasure")),
                  "learning_broken": ev.get("learning_broken"), "verdicts": ev.get("verdicts"),
                  "regenerated_after": regenerated,
                  "samples_after": samples}


def _story(decisions: list[dict]) -> dict:
    """What the run showed: which knobs a rebalancer change moved and kept, and how many were rolled back."""
    moved = [d for d in decisions if d["knob"] and d["outcome"] in (KEPT, ROLLED_BACK)]
    return {"knobs_moved": sorted({d["knob"] for d in moved}),
            "knobs_kept": sorted({d["knob"] for d in moved if d["outcome"] == KEPT}),
            "kept": sum(d["outcome"] == KEPT for d in moved),
            "rolled_back": sum(d["outcome"] == ROLLED_BACK for d in moved)}


def _print_report(result: dict, before_tp: float, after_tp: float, n_before: int, decisions: list,
                  records) -> None:
    final = result["knobs_after"]
    click.echo("")
    click.echo(f"before  {_fmt(before_tp)} samples/s   {_knobs_text(result['knobs_before'].values())}")
    click.echo(f"after   {_fmt(after_tp)} samples/s   {_knobs_text(final.values())}   ({result['speedup']}× in "
               f"{result['auto_steps']} steps under the rebalancer, then {result['after_steps']} steps measured)")
    click.echo(f"\ndecisions (oldest first; each measured by the rebalancer over the steps just before the change and "
               f"as many after it settled, so their figures differ from the {n_before} 'before' and "
               f"{result['after_steps']} 'after' steps above):")
    for d, row in zip(decisions, result["decisions"]):
        change = f"{d['knob']} {d['old_value']:g} → {d['new_value']:g}" if d["knob"] else "advice only"
        gain = row["gain_pct"]
        # The verdict's before window (the steps just before the change), the one its gain is measured against.
        before_w = (d["evidence"].get("before_window") or {}).get("samples_per_s")
        measured = (f"{_fmt(before_w or d['throughput_before_samples_per_s'])} → "
                    f"{_fmt(d['throughput_after_samples_per_s'])} samples/s ({gain:+.1f} %)" if gain is not None else
                    f"{_fmt(d['throughput_before_samples_per_s'])} samples/s before")
        step = f" at step {d['applied_step']}" if d["applied_step"] is not None else ""
        outcome = "kept, no measurable gain" if d["outcome"] == KEPT and row["no_gain"] else d["outcome"]
        click.echo(f"  #{d['id']:<3} {d['rule']:<20} {change:<24}{step:<14} {measured:<40} {outcome}")
        _print_why(d)
        if d["outcome"] == ROLLED_BACK:
            _print_rollback(d, row)
    click.echo("\nOn a GPU node: `trimtab up`, attach the hook to your trainer (README, 'A short tour'; docs/hook.md), "
               "then `trimtab check` and GET /v1/decisions show the same story for your job.")


def _print_why(d: dict) -> None:
    """The rule's reading that asked for the change — and, for a rule below its act line, that it followed a
    measured gain through (else "44.6 % of step … act above 50" reads as a misfire)."""
    reading = d["evidence"].get("reading", {})
    if reading.get("message"):
        click.echo(f"        why: {reading['message']}")
    follow = next((p for p in d["evidence"].get("step_policy", []) if isinstance(p, str)
                   and p.startswith("following through")), None)
    if follow:
        click.echo(f"        {follow}")


def _print_rollback(d: dict, row: dict) -> None:
    v = row["verdict"] or {}
    if row.get("learning_broken"):  # the learning guards (issue 41): the pipeline's own clip fraction, KL, …
        both = row.get("verdicts") or {}
        click.echo(f"        learning does not keep up: {both.get('learning')}; throughput {both.get('throughput')}: "
                   f"{d['knob']} back to {d['old_value']:g}")
        return
    if v:
        # Measurably worse, or not told apart from noise and no better: either way back to the known setting.
        said = "not told apart from noise and no better" if row["back_to_known"] else "worse"
        if row.get("remeasure"):  # the steps before it were still settling (a warm-up): not judged, re-measured
            said = "not judged, the steps before it had not settled (re-measured later)"
        click.echo(f"        verdict: {100 * (v['ratio'] - 1):+.1f} % (95 % interval {v['ci_pct'][0]:+.1f} … "
                   f"{v['ci_pct'][1]:+.1f} %, {v['confidence_pct']:.0f} % sure; {v['n_before']} sync periods "
                   f"before, {v['n_after']} after): {said}, {d['knob']} back to {d['old_value']:g}")
    if row["regenerated_after"]:
        click.echo(f"        the pipeline's count: {row['regenerated_after']} of the {row['samples_after']} samples "
                   f"after the change were sampled twice — generation ran further ahead than this job's staleness "
                   f"bound, so those batches were too stale to train on")
