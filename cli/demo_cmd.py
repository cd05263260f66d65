"""`trimtab demo`: the closed loop on this machine's CPU in a minute or two — the first thing to run after installing.

It starts a real `trimtab up` (simulated node when there is no NVIDIA driver) on a free loopback port with its own
state directory, runs the reference PPO pipeline (``demo`` config: tiny models, CPU) at the brief's bad defaults
for a few steps, then hands it to the rebalancer in ``auto`` mode and runs until the rebalancer has had nothing to
change for a while. It prints throughput before and after, the knob path and every decision with its evidence
and measured effect. Needs the `[trainer]` extra (torch).
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import click


def _fmt(value, unit: str = "") -> str:
    return "–" if value is None else f"{value:,.1f}{unit}"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the readable report.")
@click.option("--budget", "budget_s", type=click.FloatRange(10, 3600), default=120.0, show_default=True,
              metavar="SECONDS", help="Longest the rebalanced run may take.")
@click.option("--quiet-steps", type=click.IntRange(5, 1000), default=30, show_default=True,
              help="Stop once the rebalancer had nothing to change for this many steps in a row (they are the "
                   "'after' measurement).")
@click.option("--before-steps", type=click.IntRange(2, 1000), default=8, show_default=True,
              help="Steps measured at the bad defaults (after one warm-up step).")
@click.option("--keep-state", is_flag=True, help="Keep the demo daemon's state directory (store, log) afterwards.")
def demo(as_json: bool, budget_s: float, quiet_steps: int, before_steps: int, keep_state: bool) -> None:
    """Watch the rebalancer fix a badly configured PPO job on this CPU (about 90 s on 2 CPU cores).

    Starts a private `trimtab up` on a free loopback port, runs the reference pipeline from deliberately bad
    settings (batch 1, no prefetch, sync every step), lets the rebalancer change its knobs in `auto` mode, and
    prints throughput before and after with every decision it took. The header's before/after are the steps
    before the hand-off and the last --quiet-steps steps; each decision's figures are the rebalancer's own
    windows around that change. Nothing outside a temporary directory is touched.
    """
    try:
        import torch  # noqa: F401

        from trimtab.trainer import attach
        from trimtab.trainer.pipeline import story
        from trimtab.trainer.pipeline.config import parse_device_map, preset
        from trimtab.trainer.pipeline.loop import Pipeline, set_cpu_threads
    except ImportError as exc:
        raise click.ClickException(f"demo needs the trainer extra (pip install 'trimtab[trainer]'): {exc}") from exc

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
            f"{config.prompt_tokens}+{config.response_tokens} tokens)")
        defaults = story.default_knobs()
        with Pipeline(config, devices, knobs=dict(defaults)) as pipe:
            before_tp, before = story.measure_static(pipe, defaults, warmup=1, steps=before_steps)
            say(f"before: {before_tp:,.1f} samples/s at batch_size 1, prefetch 0, sync_every 1 "
                f"({len(before)} steps)")
            say("handing the job to the rebalancer (mode auto) …")
            hook = attach(job=job, server=daemon.url, token=daemon.token, device_map=devices.as_hook_map(),
                          knobs=story.declaration(defaults, config), mode="auto")
            last_knobs = [story.knob_tuple(before[-1])]

            def progress(record) -> None:
                knobs = story.knob_tuple(record)
                if knobs != last_knobs[0]:
                    say(f"  step {record.step:4d}: knobs now batch_size {knobs[0]}, prefetch {knobs[1]}, "
                        f"sync_every {knobs[2]} — {record.samples_per_s:,.1f} samples/s")
                    last_knobs[0] = knobs

            run = story.run_auto(pipe, hook, max_steps=100_000, budget_s=budget_s, tail_steps=quiet_steps,
                                 show=progress, settled=story.rebalancer_idle(daemon, job))
            hook.close()
        decisions = list(reversed(story.api_get(daemon, f"/v1/decisions?job={job}&limit=200")["decisions"]))
        job_out = story.api_get(daemon, f"/v1/jobs/{job}")
        changes = list(reversed(story.api_get(daemon, f"/v1/jobs/{job}/changes?limit=200")["changes"]))
    finally:
        daemon.stop()
        if not keep_state:
            shutil.rmtree(daemon.state_dir, ignore_errors=True)
    after = run.records[-quiet_steps:]
    after_tp = story.throughput(after) or 0.0
    final = dict(zip(("batch_size", "prefetch", "sync_every"), story.knob_tuple(run.records[-1])))
    bounds_ok = all(job_out["knobs"][k]["min"] <= v <= job_out["knobs"][k]["max"] for k, v in final.items())
    result = {
        "job": job, "config": config.name, "device": "cpu", "simulated_node": bool(health.get("simulated")),
        "before_samples_per_s": round(before_tp, 2), "after_samples_per_s": round(after_tp, 2),
        "speedup": round(after_tp / before_tp, 2) if before_tp else None,
        "knobs_before": defaults, "knobs_after": final, "within_bounds": bounds_ok,
        "auto_steps": len(run.records), "stopped_because": run.stopped_because,
        "seconds": round(time.monotonic() - started, 1),
        "changes": [{k: c[k] for k in ("change_id", "knob", "value", "previous_value", "source", "status",
                                       "applied_step", "reason")} for c in changes],
        "decisions": [{k: d[k] for k in ("id", "rule", "change_id", "knob", "old_value", "new_value", "applied_step",
                                         "throughput_before_samples_per_s", "throughput_after_samples_per_s",
                                         "outcome", "advice")} | {"gain_pct": d["evidence"].get("gain_pct")}
                      for d in decisions],
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo("")
    click.echo(f"before  {_fmt(before_tp)} samples/s   batch_size 1, prefetch 0, sync_every 1")
    click.echo(f"after   {_fmt(after_tp)} samples/s   batch_size {final['batch_size']}, prefetch {final['prefetch']}, "
               f"sync_every {final['sync_every']}   ({result['speedup']}× in {len(run.records)} steps, "
               f"last {len(after)} steps measured)")
    click.echo(f"\ndecisions (oldest first; each measured by the rebalancer over the steps just before the change and "
               f"as many after it settled, so their figures differ from the {len(before)} 'before' and {len(after)} "
               f"'after' steps above):")
    for d in decisions:
        change = f"{d['knob']} {d['old_value']} → {d['new_value']}" if d["knob"] else "advice only"
        gain = d["evidence"].get("gain_pct")
        measured = (f"{_fmt(d['throughput_before_samples_per_s'])} → {_fmt(d['throughput_after_samples_per_s'])} "
                    f"samples/s ({gain:+.1f} %)" if gain is not None else
                    f"{_fmt(d['throughput_before_samples_per_s'])} samples/s before")
        step = f" at step {d['applied_step']}" if d["applied_step"] is not None else ""
        click.echo(f"  #{d['id']:<3} {d['rule']:<20} {change:<24}{step:<14} {measured:<40} {d['outcome']}")
        reading = d["evidence"].get("reading", {})
        if reading.get("message"):
            click.echo(f"        why: {reading['message']}")
    click.echo("\nOn a GPU node: `trimtab up`, attach the hook to your trainer (README, 'The rebalancer'), then "
               "`trimtab check` and GET /v1/decisions show the same story for your job.")
    if not bounds_ok:  # never expected: the hook and the controller both clamp
        click.echo("warning: a knob ended outside its declared bounds", err=True)
        sys.exit(1)
