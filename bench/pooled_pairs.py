"""Pool the paired blocks of several reference-pipeline runs (``bench/rebalance.py --paired-blocks``) into one
figure with an interval that knows the pairs come in runs: the mean of all pairs, each run's mean, and a
run-clustered bootstrap 95 % interval (resample runs, then pairs within each drawn run). Pairs of one run share a
day's host, so resampling pairs alone would call a figure surer than the runs make it.

    python3 bench/pooled_pairs.py 21=104.9,97.7,98.2,100.5,100.7,121.3 22=92.1,107.0,108.9,91.0,91.0 \\
        23=121.0,95.9,107.3,96.3,124.9      # each run: its pairs' auto/best ratios, in %, from its printout

``--drop-first RUN,...`` leaves out the first pair of those runs (a pair that holds the controller's climb).
"""

from __future__ import annotations

import argparse
import random
import statistics


def parse_run(text: str) -> tuple[str, list[float]]:
    name, _, pairs = text.partition("=")
    values = [float(x) for x in pairs.split(",") if x.strip()]
    if not name or not values:
        raise argparse.ArgumentTypeError(f"expected RUN=PCT,PCT,…, got {text!r}")
    return name, values


def pooled(runs: dict[str, list[float]], draws: int = 20_000, seed: int = 1) -> dict:
    every = [x for pairs in runs.values() for x in pairs]
    rnd = random.Random(seed)
    names = list(runs)
    means = []
    for _ in range(draws):
        drawn = [runs[rnd.choice(names)] for _ in names]
        means.append(statistics.mean(rnd.choice(pairs) for pairs in drawn for _ in pairs))
    means.sort()
    return {"pairs": len(every), "mean_pct": statistics.mean(every),
            "per_run_pct": {n: statistics.mean(p) for n, p in runs.items()},
            "interval_pct": (means[int(0.025 * draws)], means[int(0.975 * draws) - 1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=parse_run, help="RUN=PCT,PCT,… (a run's pair ratios in %%)")
    ap.add_argument("--drop-first", default="", help="runs whose first pair is left out (comma-separated)")
    ap.add_argument("--draws", type=int, default=20_000)
    args = ap.parse_args()
    drop = {x for x in args.drop_first.split(",") if x}
    runs = {name: pairs[1:] if name in drop else pairs for name, pairs in args.runs}
    if any(not pairs for pairs in runs.values()):
        ap.error("a run has no pairs left")
    out = pooled(runs, args.draws)
    lo, hi = out["interval_pct"]
    print(f"{out['pairs']} pairs of {len(runs)} runs: mean {out['mean_pct']:.1f} %, per run "
          f"{', '.join(f'{v:.1f}' for v in out['per_run_pct'].values())} %; run-clustered bootstrap 95 % interval "
          f"{lo:.1f}–{hi:.1f} % ({args.draws} draws)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
