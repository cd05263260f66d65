"""What writing a scrape costs: trimtab's own text exposition against prometheus_client's ``generate_latest`` on the
same families, timed in the same run (issue 39: ``generate_latest`` took 0.6 s of an 80-GPU scrape, ~90 µs a
sample). The byte-for-byte equality of the two is a test (``tests/api/metrics/test_render.py``); the ratio is
measured here, not asserted in the suite (the 2-core dev machine under load read 2.0–3× on the same code).

N simulated nodes of 4 GPUs tick once through the real sampler into a live snapshot (no store), the collector
builds the scrape's families, and each writer renders them ``--repeats`` times; the best of each is printed with
the ratio:

    python3 bench/metrics_render.py [--nodes 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _src_on_path() -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.insert(0, str(src))


class _Listed:
    """A registry of fixed families, as ``generate_latest`` reads one."""

    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def best_s(render, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        render()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50, help="simulated nodes of 4 GPUs in the scrape")
    ap.add_argument("--repeats", type=int, default=5, help="renders of each writer; the best counts")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.repeats < 1:
        ap.error("--nodes and --repeats must be at least 1")
    _src_on_path()
    from prometheus_client import generate_latest

    from trimtab.agent.sampler import Sampler
    from trimtab.agent.simulated import SimulatedNode
    from trimtab.api.context import ApiContext
    from trimtab.api.metrics import TrimtabCollector
    from trimtab.api.metrics.render import text_exposition
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    with tempfile.TemporaryDirectory() as tmp:
        engine = open_engine(f"sqlite:///{tmp}/trimtab.db")
        try:
            migrate(engine)
            ctx = ApiContext(engine=engine, mode="up", state_dir=Path(tmp))
            for i in range(args.nodes):
                host = f"sim-{i:02d}"
                Sampler([SimulatedNode(4, "balanced", hostname=host)], ctx.snapshot.update, hostname=host).tick()
            metrics = list(TrimtabCollector(ctx).collect())
            samples = sum(len(m.samples) for m in metrics)
            ours = best_s(lambda: text_exposition(metrics), args.repeats)
            theirs = best_s(lambda: generate_latest(_Listed(metrics)), args.repeats)
        finally:
            engine.dispose()
    print(f"{args.nodes} simulated nodes × 4 GPUs: {len(metrics)} families, {samples} samples")
    print(f"best of {args.repeats}: trimtab's exposition {ours * 1000:.2f} ms, generate_latest {theirs * 1000:.2f} ms "
          f"({ours / samples * 1e6:.1f} / {theirs / samples * 1e6:.1f} µs a sample)")
    print(f"generate_latest / trimtab's: {theirs / ours:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
