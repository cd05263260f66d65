"""``python -m trimtab.workload``: run the reference PPO job, one line per step, a summary, ``--json``.

Defaults are deliberately bad settings (batch 1, no prefetch, sync every step), the state the
rebalancer is meant to pull the job out of.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trimtab.trainer import attach

from .config import DEFAULT_KNOBS, KNOB_BOUNDS, PRESETS, Knobs, parse_device_map, preset
from .loop import Pipeline, StepRecord, set_cpu_threads


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not ≥ 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trimtab.workload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(PRESETS), default="tiny", help="model and batch sizes")
    parser.add_argument("--steps", type=positive, default=10)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_KNOBS["batch_size"],
                        help="samples per generation call (knob)")
    parser.add_argument("--prefetch", type=int, default=DEFAULT_KNOBS["prefetch"],
                        help="generated batches that may wait for scoring; 0 = strictly sequential (knob)")
    parser.add_argument("--sync-every", type=int, default=DEFAULT_KNOBS["sync_every"],
                        help="steps between weight syncs into the generation copy (knob)")
    parser.add_argument("--device-map", default=None,
                        help="cpu | cuda:0 | JSON | 'actor=0,1;critic=2;reward=3;ref=0' (default: cuda:0, else cpu)")
    parser.add_argument("--sync-via", choices=("direct", "host"), default=None,
                        help="how weights reach the generation copy (default: the config's)")
    parser.add_argument("--samples-per-step", type=int, default=None, help="override the config's")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--server", default=None, help="trimtab server URL; standalone without it")
    parser.add_argument("--token", default=None)
    parser.add_argument("--job", default="ppo-demo")
    parser.add_argument("--mode", choices=("auto", "advise", "off"), default=None,
                        help="register the job in this rebalancer mode (default: keep the server's; new jobs: advise)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write per-step records here")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="torch intra-op threads (default: 1 when everything runs on the CPU, else torch's)")
    parser.add_argument("--quiet", action="store_true", help="only the summary line")
    return parser


def summarize(records: list[StepRecord]) -> dict:
    """Totals, plus throughput without the first step (start-up: allocator growth, kernel selection)."""
    samples = sum(r.samples for r in records)
    seconds = sum(r.step_s for r in records)
    steady = records[1:] or records
    return {"steps": len(records), "samples": samples, "seconds": seconds,
            "samples_per_s": samples / seconds if seconds else None,
            "steady_samples_per_s": sum(r.samples for r in steady) / sum(r.step_s for r in steady),
            "reward_first": records[0].reward_mean, "reward_last": records[-1].reward_mean}


def knob_declaration(start: Knobs, samples_per_step: int) -> dict[str, tuple[int, int, int]]:
    """(start, min, max) per knob, as the hook declares them; a generation call never exceeds a step's samples."""
    bounds = dict(KNOB_BOUNDS, batch_size=(1, samples_per_step))
    return {name: (getattr(start, name), low, high) for name, (low, high) in bounds.items()}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in (("sync_via", args.sync_via), ("samples_per_step", args.samples_per_step),
                                   ("seed", args.seed)) if v is not None}
    config = preset(args.config, **overrides)
    devices = parse_device_map(args.device_map)
    threads = set_cpu_threads(devices, args.cpu_threads)
    start = Knobs.read({"batch_size": args.batch_size, "prefetch": args.prefetch, "sync_every": args.sync_every})
    hook = attach(job=args.job, server=args.server, token=args.token, device_map=devices.as_hook_map(),
                  knobs=knob_declaration(start, config.samples_per_step), mode=args.mode)
    print(f"config {config.name}: actor {config.actor}, {config.samples_per_step} samples/step, "
          f"{config.prompt_tokens}+{config.response_tokens} tokens, sync via {config.sync_via}; {devices}; "
          f"{threads} CPU threads", flush=True)
    try:
        with Pipeline(config, devices, hook=hook, log=lambda line: print(line, flush=True)) as pipeline:
            show = None if args.quiet else (lambda record: print(record.line(), flush=True))
            records = pipeline.run(args.steps, show)
    finally:
        hook.close()
    summary = summarize(records)
    print(f"summary: {summary['steps']} steps, {summary['samples']} samples in {summary['seconds']:.2f} s, "
          f"{summary['samples_per_s']:.1f} samples/s ({summary['steady_samples_per_s']:.1f} after step 0), "
          f"reward {summary['reward_first']:.3f} → {summary['reward_last']:.3f}", flush=True)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({"config": config.name, "device_map": str(devices),
                                              "summary": summary, "records": [r.as_dict() for r in records]},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
