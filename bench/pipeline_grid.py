"""Do the three knobs matter? The reference PPO pipeline over a grid of batch_size × prefetch × sync_every.

One process, one set of models: first ``--warmup`` steps at the largest batch size warm CUDA, cuBLAS and the
allocator; then each setting restarts the workers (nothing generated under one setting is counted under the
next), runs ``--warmup`` steps where they are needed (below), then ``--steps`` measured steps. Steady-state
samples/s = measured samples / measured wall time. Every step does the same work (``samples_per_step`` samples,
fixed PPO minibatches), so only scheduling differs. The default setting (1, 0, 1), a deliberately badly tuned job
(batch 1, no prefetch, sync every step), runs first and is the baseline of the ratio column; the rest run cheapest
(largest batch) first.

A setting's warm-up is skipped where it buys nothing: with at least max(8, 16 × prefetch) generation calls per
step, filling the prefetch queue is a small part of one step — which spares the slow batch-1 settings a whole
unmeasured step each.

``--budget-s`` bounds the whole run, model building included: each setting gets an equal share of what is left
(unused shares roll over) and stops taking measured steps when the next would overrun it (one at least); a
setting whose single step is predicted not to fit in all that is left is skipped and listed.

    python bench/pipeline_grid.py [--config tiny|h200] [--device-map cpu] [--batch-sizes 1,4,16,64]
        [--prefetch 0,2] [--sync-every 1,4] [--steps 3] [--warmup 1] [--budget-s 330] [--json PATH]

On one H200: ``python3 bench/pipeline_grid.py --config h200 --steps 2 --json grid_h200.json`` (budget 300 s).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import types
from pathlib import Path

START_S = time.perf_counter()
DEFAULT_SETTING = (1, 0, 1)


def _import_pipeline():
    """The pipeline package, installed or straight from this checkout (a bare GPU machine may have no editable
    install, nor httpx, which ``trimtab.trainer``'s hook needs and this benchmark does not)."""
    try:
        import trimtab.workload.loop  # noqa: F401
    except ImportError:
        repo = Path(__file__).resolve().parents[1]
        for name, folder in (("trimtab", "core"), ("trimtab.trainer", "trainer")):
            package = types.ModuleType(name)
            package.__path__ = [str(repo / folder)]
            sys.modules[name] = package
    from trimtab.workload import config, loop

    return config, loop


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def calls_per_step(batch_size: int, samples_per_step: int) -> int:
    return math.ceil(samples_per_step / batch_size)


class StepClock:
    """Predicts a step's seconds at a batch size from steps measured so far: the non-generation part as measured,
    the generation part scaled by generation calls per step (a call costs about the same at any batch while
    decoding is launch-bound, so this errs long when scaling towards larger batches)."""

    def __init__(self, samples_per_step: int):
        self.samples_per_step = samples_per_step
        self._seen: dict[int, tuple[float, float]] = {}   # batch size → (step s, generation busy s)

    def record(self, batch_size: int, records) -> None:
        if records:
            n = len(records)
            self._seen[batch_size] = (sum(r.step_s for r in records) / n, sum(r.generation_s for r in records) / n)

    def predict_s(self, batch_size: int) -> float | None:
        if not self._seen:
            return None
        nearest = min(self._seen, key=lambda b: abs(math.log(b / batch_size)))
        step_s, generation_s = self._seen[nearest]
        scale = calls_per_step(batch_size, self.samples_per_step) / calls_per_step(nearest, self.samples_per_step)
        return max(0.0, step_s - generation_s) + min(generation_s, step_s) * scale


def run_setting(pipeline, warmup: int, steps: int, share_s: float) -> list:
    """Warm-up, then measured steps until ``steps`` or until another would overrun ``share_s`` (at least one)."""
    started = time.perf_counter()
    pipeline.restart_workers()   # the new prefetch/batch size start from an empty queue
    pipeline.run(warmup)
    records = []
    while len(records) < steps:
        records.append(pipeline.step())
        mean_s = sum(r.step_s for r in records) / len(records)
        if time.perf_counter() - started + mean_s > share_s:
            break
    return records


def run_grid(args, pipeline, settings, samples_per_step: int, log) -> tuple[list[dict], list]:
    knobs = pipeline.knobs
    clock = StepClock(samples_per_step)
    largest = max(s[0] for s in settings)
    knobs.update(batch_size=largest, prefetch=0, sync_every=1)
    warm = pipeline.run(args.warmup)
    clock.record(largest, warm)
    if warm:
        log(f"warm-up: {len(warm)} steps at batch {largest}, {warm[-1].step_s:.3f} s/step")
    results, skipped = [], []
    for index, (batch_size, prefetch, sync_every) in enumerate(settings):
        knobs.update(batch_size=batch_size, prefetch=prefetch, sync_every=sync_every)
        left_s = args.budget_s - (time.perf_counter() - START_S) if args.budget_s else math.inf
        guess_s = clock.predict_s(batch_size)
        if index > 0 and guess_s is not None and guess_s > left_s:
            skipped.append((batch_size, prefetch, sync_every))
            log(f"skip {batch_size}/{prefetch}/{sync_every}: one step ≈ {guess_s:.1f} s, {left_s:.1f} s left")
            continue
        calls = calls_per_step(batch_size, samples_per_step)
        warmup = 0 if calls >= max(8, 16 * prefetch) else args.warmup
        records = run_setting(pipeline, warmup, args.steps, left_s / (len(settings) - index))
        clock.record(batch_size, records)
        seconds = sum(r.step_s for r in records)
        mean = lambda field: sum(getattr(r, field) for r in records) / len(records)  # noqa: E731
        row = {"batch_size": batch_size, "prefetch": prefetch, "sync_every": sync_every, "warmup": warmup,
               "steps": len(records), "samples_per_s": sum(r.samples for r in records) / seconds,
               "step_s": seconds / len(records), "generation_s": mean("generation_s"),
               "evaluation_s": mean("evaluation_s"), "update_s": mean("update_s"),
               "communication_s": mean("communication_s"), "wait_s": mean("wait_s"),
               "staleness": mean("staleness_mean"), "reward_mean": mean("reward_mean")}
        results.append(row)
        log(f"{batch_size:4d} {prefetch:2d} {sync_every:2d}  {row['samples_per_s']:9.1f} samples/s  "
            f"({warmup}+{len(records)} steps, {row['step_s']:.3f} s/step)")
    return results, skipped


def knob_effects(results: list[dict]) -> dict[str, dict]:
    """For each knob, the ratio of samples/s between its values with the other two knobs held fixed: geometric
    mean, min and max over the pairs (so one knob's effect is not confused with another's)."""
    by_setting = {(r["batch_size"], r["prefetch"], r["sync_every"]): r["samples_per_s"] for r in results}
    effects = {}
    for position, name in enumerate(("batch_size", "prefetch", "sync_every")):
        values = sorted({key[position] for key in by_setting})
        low = values[0]
        for high in values[1:]:
            ratios = []
            for key, sps in by_setting.items():
                if key[position] == high:
                    base = key[:position] + (low,) + key[position + 1:]
                    if base in by_setting:
                        ratios.append(sps / by_setting[base])
            if ratios:
                geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                effects[f"{name} {low}→{high}"] = {"geomean": geo, "min": min(ratios), "max": max(ratios),
                                                   "pairs": len(ratios)}
    return effects


def print_table(results: list[dict], baseline: float) -> None:
    print("\n| batch | prefetch | sync_every | steps | samples/s | × default | s/step | gen s | eval s | update s "
          "| comm s | wait s | staleness |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(results, key=lambda r: -r["samples_per_s"]):
        print(f"| {r['batch_size']} | {r['prefetch']} | {r['sync_every']} | {r['warmup']}+{r['steps']} | "
              f"{r['samples_per_s']:.1f} | {r['samples_per_s'] / baseline:.2f} | {r['step_s']:.3f} | "
              f"{r['generation_s']:.3f} | {r['evaluation_s']:.3f} | {r['update_s']:.3f} | "
              f"{r['communication_s']:.3f} | {r['wait_s']:.3f} | {r['staleness']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--device-map", default=None)
    parser.add_argument("--batch-sizes", type=parse_ints, default=[1, 4, 16, 64])
    parser.add_argument("--prefetch", type=parse_ints, default=[0, 2])
    parser.add_argument("--sync-every", type=parse_ints, default=[1, 4])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per setting")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-clock bound for the whole run (default: 300 with --config h200, else none)")
    parser.add_argument("--sync-via", choices=("direct", "host"), default=None)
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="torch intra-op threads (default: 1 when everything runs on the CPU, else torch's)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.budget_s is None and args.config == "h200":
        args.budget_s = 300.0   # GPU minutes are scarce: never let a slower host turn this into a long run
    config_mod, loop = _import_pipeline()
    overrides = {"sync_via": args.sync_via} if args.sync_via else {}
    config = config_mod.preset(args.config, **overrides)
    devices = config_mod.parse_device_map(args.device_map)
    threads = loop.set_cpu_threads(devices, args.cpu_threads)
    grid = list(itertools.product(args.batch_sizes, args.prefetch, args.sync_every))
    rest = sorted((s for s in grid if s != DEFAULT_SETTING), key=lambda s: (-s[0], s[1], s[2]))
    settings = [DEFAULT_SETTING] + rest
    log = lambda line: print(line, flush=True)  # noqa: E731
    log(f"pipeline grid: config {config.name} (actor {config.actor}, {config.samples_per_step} samples/step, "
        f"{config.prompt_tokens}+{config.response_tokens} tokens, sync via {config.sync_via}); {devices}; "
        f"{threads} CPU threads; {len(settings)} settings, {args.warmup}+{args.steps} steps each"
        + (f", budget {args.budget_s:.0f} s" if args.budget_s else ""))
    knobs = dict(zip(("batch_size", "prefetch", "sync_every"), DEFAULT_SETTING))
    with loop.Pipeline(config, devices, knobs=knobs, log=log) as pipeline:
        log(f"models built in {time.perf_counter() - START_S:.1f} s since start")
        results, skipped = run_grid(args, pipeline, settings, config.samples_per_step, log)
    baseline = next(r["samples_per_s"] for r in results if (r["batch_size"], r["prefetch"], r["sync_every"])
                    == DEFAULT_SETTING)
    best = max(results, key=lambda r: r["samples_per_s"])
    print_table(results, baseline)
    effects = knob_effects(results)
    print("\nknob effects (samples/s ratio with the other two knobs fixed; geomean [min, max]):")
    for name, effect in effects.items():
        print(f"  {name}: {effect['geomean']:.2f}× [{effect['min']:.2f}, {effect['max']:.2f}] "
              f"over {effect['pairs']} pairs")
    elapsed_s = time.perf_counter() - START_S
    print(f"\nbest {best['batch_size']}/{best['prefetch']}/{best['sync_every']}: {best['samples_per_s']:.1f} "
          f"samples/s = {best['samples_per_s'] / baseline:.1f}× the default (1/0/1: {baseline:.1f} samples/s); "
          f"{elapsed_s:.0f} s in all" + (f"; skipped {skipped}" if skipped else ""))
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({
            "config": config.name, "device_map": str(devices), "cpu_threads": threads,
            "sync_via": config.sync_via, "samples_per_step": config.samples_per_step,
            "baseline_samples_per_s": baseline, "best": best, "effects": effects, "results": results,
            "skipped": skipped, "elapsed_s": elapsed_s, "budget_s": args.budget_s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
