"""What does one NVML tick cost per GPU — trimtab's sampling path against the naive one? (H200 check)

trimtab: ``NvmlSource.sample()`` at ``--hz`` for ``--ticks`` ticks (default 9.5 Hz: GPM needs its samples more
than 100 ms apart, and ticks on an exact 100 ms grid would straddle that limit, skipping GPM on about half), with
every NVML call timed through the source's ``on_call`` hook. Naive: the same cheap calls plus
``nvmlDeviceGetPcieThroughput`` TX and RX on the tick (each blocks ~20 ms), measured in the same run. Prints the
median and p99 per GPU per tick, each call's cost, the ratio naive/trimtab, the target (≤ 100 µs of NVML time
per GPU per tick), and the metrics that read as unsupported.

    python bench/nvml_tick.py [--ticks 200] [--hz 9.5] [--naive-ticks 20] [--gpus 0,1] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

TARGET_NVML_US_PER_GPU = 100.0


def _import_agent():
    """trimtab.agent, installed or straight from this checkout (a bare GPU machine may have no editable install)."""
    try:
        import trimtab.agent.nvml  # noqa: F401
    except ImportError:
        import importlib.util

        repo = Path(__file__).resolve().parents[1]
        for name, folder in (("trimtab", "core"), ("trimtab.agent", "agent")):
            spec = importlib.util.spec_from_file_location(name, repo / folder / "__init__.py",
                                                          submodule_search_locations=[str(repo / folder)])
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    from trimtab.agent import nvml
    from trimtab.agent.source import SourceUnavailable

    return nvml, SourceUnavailable


def us_stats(seconds: list[float]) -> dict:
    """median / p99 / max in µs."""
    if not seconds:
        return {"n": 0, "median_us": None, "p99_us": None, "max_us": None}
    ordered = sorted(seconds)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {"n": len(ordered), "median_us": statistics.median(ordered) * 1e6, "p99_us": p99 * 1e6,
            "max_us": ordered[-1] * 1e6}


def paced(ticks: int, hz: float, body: Callable[[int], None]) -> None:
    """Run ``body(k)`` on a fixed grid of 1/hz; a late tick runs at once (no burst to catch up)."""
    period, deadline = 1.0 / hz, time.monotonic()
    for k in range(ticks):
        deadline += period
        body(k)
        time.sleep(max(0.0, deadline - time.monotonic()))


def bench_trimtab(nvml, indices, ticks: int, hz: float, use_gpm: bool = True) -> dict:
    main = threading.get_ident()
    per_call: dict[str, list[float]] = defaultdict(list)
    tick_nvml = [0.0]

    def on_call(name: str, seconds: float) -> None:
        if threading.get_ident() == main:  # the slow thread (pre-Hopper only) is not the tick
            per_call[name].append(seconds)
            tick_nvml[0] += seconds

    source = nvml.NvmlSource(indices=indices, on_call=on_call, use_gpm=use_gpm)
    inv = source.inventory()
    n = max(1, len(inv.gpus))
    warm = 2  # the first GPM tick has nothing to compare with
    per_call.clear()
    walls, nvml_times, last = [], [], [None]

    def tick(k: int) -> None:
        if k == warm:
            per_call.clear()
        tick_nvml[0] = 0.0
        last[0] = source.sample(int(time.time() * 1000))
        if k >= warm:
            walls.append(source.last_tick_cost_s / n)
            nvml_times.append(tick_nvml[0] / n)

    paced(ticks + warm, hz, tick)
    result = {
        "inventory": {"driver": inv.driver_version, "nvml": inv.nvml_version,
                      "gpus": [{"index": g.index, "name": g.name, "gpm": g.gpm_supported,
                                "nvlink_links": g.nvlink_link_count, "pcie": f"Gen{g.pcie_max_gen} x{g.pcie_max_width}",
                                "pcie_peak_GBps": g.pcie_peak_bytes_per_s and g.pcie_peak_bytes_per_s / 1e9}
                               for g in inv.gpus]},
        "tick_wall_per_gpu": us_stats(walls),
        "tick_nvml_per_gpu": us_stats(nvml_times),
        "calls": {name: {**us_stats(v), "per_tick": len(v) / max(1, len(walls))}
                  for name, v in sorted(per_call.items())},
        "unsupported": [f"gpu{i}:{m}" if i is not None else m for i, m in source.unsupported()],
        "last_sample": [s.__dict__ for s in last[0].gpu_samples] if last[0] else [],
        "events": [e.__dict__ for e in last[0].events] if last[0] else [],
    }
    source.close()
    return result


def bench_naive(nvml, indices, ticks: int, hz: float) -> dict:
    """The cheap calls plus the blocking PCIe counter on the tick, straight through the bindings."""
    nv = nvml.load_pynvml()
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in (indices if indices is not None else range(count))]
    temperature = getattr(nv, "nvmlDeviceGetTemperatureV", nv.nvmlDeviceGetTemperature)
    calls = {
        "util": lambda h: nv.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "power": lambda h: nv.nvmlDeviceGetPowerUsage(h),
        "temperature": lambda h: temperature(h, nv.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "clock_events": lambda h: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "processes": lambda h: nv.nvmlDeviceGetComputeRunningProcesses_v3(h),
        "pcie_tx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
    }
    per_call: dict[str, list[float]] = defaultdict(list)
    failed: set[str] = set()
    ticks_s: list[float] = []

    def tick(_k: int) -> None:
        started = time.perf_counter()
        for h in handles:
            for name, call in calls.items():
                t0 = time.perf_counter()
                try:
                    call(h)
                except Exception:  # NVMLError, or a call these bindings lack
                    failed.add(name)
                per_call[name].append(time.perf_counter() - t0)
        ticks_s.append((time.perf_counter() - started) / len(handles))

    paced(ticks, hz, tick)
    nv.nvmlShutdown()
    return {"tick_wall_per_gpu": us_stats(ticks_s),
            "calls": {name: us_stats(v) for name, v in per_call.items()}, "failed": sorted(failed)}


def _fmt(x) -> str:
    return "—" if x is None else f"{x:,.1f}"


def print_report(r: dict, args) -> None:
    t, nv = r["trimtab"], r["naive"]
    inv = t["inventory"]
    print(f"driver {inv['driver']}, NVML {inv['nvml']}; {len(inv['gpus'])} GPU(s):")
    for g in inv["gpus"]:
        print(f"  GPU {g['index']}: {g['name']}, GPM {'yes' if g['gpm'] else 'no'}, NVLink links {g['nvlink_links']},"
              f" PCIe {g['pcie']} (peak {_fmt(g['pcie_peak_GBps'])} GB/s per direction)")
    path = "pre-Hopper path, GPM off" if args.no_gpm else "GPM where supported"
    print(f"\ntrimtab NvmlSource.sample() ({path}): {args.ticks} ticks at {args.hz:g} Hz   (µs per GPU per tick)")
    print(f"  {'':28}{'median':>10}{'p99':>10}{'max':>10}")
    for label, s in (("tick, wall", t["tick_wall_per_gpu"]), ("tick, NVML calls only", t["tick_nvml_per_gpu"])):
        print(f"  {label:28}{_fmt(s['median_us']):>10}{_fmt(s['p99_us']):>10}{_fmt(s['max_us']):>10}")
    print("  each call (µs per call, calls per tick):")
    for name, s in t["calls"].items():
        print(f"    {name:26}{_fmt(s['median_us']):>10}{_fmt(s['p99_us']):>10}{_fmt(s['max_us']):>10}"
              f"   ×{s['per_tick']:.2f}")
    print(f"\nnaive (same cheap calls + GetPcieThroughput TX/RX on the tick): {args.naive_ticks} ticks")
    s = nv["tick_wall_per_gpu"]
    print(f"  {'tick, wall':28}{_fmt(s['median_us']):>10}{_fmt(s['p99_us']):>10}{_fmt(s['max_us']):>10}")
    for name, s in nv["calls"].items():
        print(f"    {name:26}{_fmt(s['median_us']):>10}{_fmt(s['p99_us']):>10}{_fmt(s['max_us']):>10}")
    if nv["failed"]:
        print(f"  failed in the naive path: {', '.join(nv['failed'])}")
    print(f"\nratio naive/trimtab (median wall per GPU per tick): {_fmt(r['ratio_naive_over_trimtab'])}×")
    verdict = "PASS" if r["target_met"] else "FAIL"
    print(f"target ≤ {TARGET_NVML_US_PER_GPU:.0f} µs of NVML time per GPU per tick (median): "
          f"{_fmt(t['tick_nvml_per_gpu']['median_us'])} µs → {verdict}")
    print(f"unsupported: {', '.join(t['unsupported']) or 'none'}")
    for s in t["last_sample"]:
        mb = {k: None if s[k] is None else s[k] / 1e6 for k in
              ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")}
        print(f"last tick {s['gpu_uuid']}: util {_fmt(s['util_pct'])} %, SM {_fmt(s['sm_active_pct'])} %,"
              f" PCIe TX/RX {_fmt(mb['pcie_tx_bytes_per_s'])}/{_fmt(mb['pcie_rx_bytes_per_s'])} MB/s,"
              f" NVLink TX/RX {_fmt(mb['nvlink_tx_bytes_per_s'])}/{_fmt(mb['nvlink_rx_bytes_per_s'])} MB/s,"
              f" mem used/reserved {_fmt(s['mem_used_bytes'] and s['mem_used_bytes'] / 2**20)}"
              f"/{_fmt(s['mem_reserved_bytes'] and s['mem_reserved_bytes'] / 2**20)} MiB")
    if t["events"]:
        print(f"events on the last tick: {t['events']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--hz", type=float, default=9.5, help="ticks per second (GPM wants > 100 ms between ticks)")
    ap.add_argument("--naive-ticks", type=int, default=20, help="the naive tick blocks ~42 ms per GPU")
    ap.add_argument("--gpus", help="comma-separated NVML indices (default: all)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--no-gpm", action="store_true",
                    help="measure trimtab's pre-Hopper path (PCIe from the background thread) even where GPM exists")
    args = ap.parse_args(argv)
    indices = [int(i) for i in args.gpus.split(",")] if args.gpus else None

    nvml, SourceUnavailable = _import_agent()
    try:
        trimtab = bench_trimtab(nvml, indices, args.ticks, args.hz, use_gpm=not args.no_gpm)
    except SourceUnavailable as exc:
        print(f"nvml_tick: cannot measure here: {exc}\nRun it on a machine with an NVIDIA GPU and driver.",
              file=sys.stderr)
        return 2
    naive = bench_naive(nvml, indices, args.naive_ticks, args.hz)
    t_med, n_med = trimtab["tick_wall_per_gpu"]["median_us"], naive["tick_wall_per_gpu"]["median_us"]
    nvml_med = trimtab["tick_nvml_per_gpu"]["median_us"]
    result = {"trimtab": trimtab, "naive": naive,
              "ratio_naive_over_trimtab": n_med / t_med if t_med and n_med else None,
              "target_nvml_us_per_gpu": TARGET_NVML_US_PER_GPU,
              "target_met": nvml_med is not None and nvml_med <= TARGET_NVML_US_PER_GPU}
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_report(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
