"""What does one NVML tick cost per GPU: trimtab's ``NvmlSource.sample()`` against the bare NVML calls it makes,
side by side in one run (goal: ours within 2× of bare, median per GPU per tick), what the per-process utilization
read does to it now that the agent makes it off the tick (issue 40: the tick with it within 1.2× of the tick
without), and what that read costs on its own. H200 check.

* **bare**: exactly the calls our tick makes — the source's own prepared list per GPU (utilization, memory v2,
  power, temperature, SM clock, clock-event reasons), a GPM sample and the GPM metrics of the same metric ids
  on GPUs with GPM (its own two samples), the process list every 5 s and an XID poll every 2 s (its own event
  set) — called straight through the bindings in a loop, nothing around them.
* **ours**: ``NvmlSource.sample()``, all of it (its GPM, its slow-thread pick-up, its events, the per-process
  activity it takes at the process list), with the agent's per-process utilization thread reading every
  ``--activity-every`` s beside it, as the agent runs.
* **ours without**: the same with ``process_activity=False`` (no per-process utilization read at all): the tick
  before the per-process call existed.

The three take turns, one tick each, at ``--hz`` (default 9.5: GPM needs a GPU's samples more than 100 ms apart;
each side samples every third tick), each tick starting after the same wait: ``sleep`` (as the daemon waits,
so each tick starts on a cold CPU) and ``spin`` (a busy wait: a warm CPU). Median and p99 per GPU per tick of
each, the ratio ours/bare and the ratio ours/ours without. Then each bare call alone in a tight loop (µs per call,
warm); the per-process read on its own (``bench/_nvml_procutil.py``: both NVML functions, in one C call and through
pynvml's wrapper, µs per call, the cheapest, and each amortized per second at ``--activity-every``); and the naive
tick (the same cheap calls plus ``nvmlDeviceGetPcieThroughput`` TX and RX, each blocking ~20 ms) for comparison.

``--fake-nvml``: no GPU needed. The real ``pynvml`` bindings run over a stand-in for ``libnvidia-ml`` whose
every function returns at once (``bench/_nvml_standin.py``; the per-process call with two records), so bare is the
bindings' own Python and ours − bare is exactly trimtab's Python per GPU per tick (the figure a real run adds to
NVML's own cost). It says so in its output; the naive tick is left out (its blocking is the driver's).

Runs unattended in under a minute by default (50 ticks a side per wait mode: 2 × 156 ticks at 9.5 Hz ≈ 33 s, then
the calls alone, the per-process read's ways, 20 calls each a GPU, and the naive tick), printing a progress line
(stderr, flushed) at each stage; ``--budget-s`` caps the timed ticks (a run cut short says how many ticks each side
had). Exit 0 when it measured (the verdicts are in the output), 2 where it cannot (no NVML, driver or GPU: one
line on stderr says so; ``--fake-nvml`` runs anywhere).

    python3 bench/nvml_tick.py [--ticks 50] [--hz 9.5] [--wait sleep|spin|both] [--naive-ticks 20] [--gpus 0,1]
                               [--activity-every 1] [--activity-calls 20] [--budget-s 45]
                               [--fake-nvml [--fake-gpus 8]] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench._nvml_procutil import print_ways, time_ways  # noqa: E402
from bench._nvml_standin import install_no_cost_nvml  # noqa: E402

GOAL_RATIO = 2.0
GOAL_ACTIVITY_RATIO = 1.2  # ours with the per-process utilization read (off the tick) / ours without it


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


# -- statistics and pacing -----------------------------------------------------------------------------------------

def us_stats(seconds: list[float]) -> dict:
    """median / p99 / max in µs."""
    if not seconds:
        return {"n": 0, "median_us": None, "p99_us": None, "max_us": None}
    ordered = sorted(seconds)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {"n": len(ordered), "median_us": statistics.median(ordered) * 1e6, "p99_us": p99 * 1e6,
            "max_us": ordered[-1] * 1e6}


def wait_until(deadline: float, how: str) -> None:
    if how == "spin":
        while time.perf_counter() < deadline:
            pass
    else:
        time.sleep(max(0.0, deadline - time.perf_counter()))


def progress(message: str) -> None:
    """A progress line on stderr, flushed at once (a run under a time limit shows how far it got)."""
    print(f"nvml_tick: {message}", file=sys.stderr, flush=True)


def paced(ticks: int, hz: float, how: str, body: Callable[[int], None], stop_at: float = math.inf) -> int:
    """``body(k)`` on a fixed grid of 1/hz, waiting ``how`` between; a late tick runs at once (no burst). Stops at
    ``stop_at`` (perf_counter) if the ticks have not ended by then; returns how many ran."""
    period, deadline = 1.0 / hz, time.perf_counter()
    for k in range(ticks):
        if time.perf_counter() >= stop_at:
            return k
        deadline += period
        body(k)
        wait_until(deadline, how)
    return ticks


# -- bare: the calls our tick makes, straight ----------------------------------------------------------------------

class BareTick:
    """The calls ``source``'s tick makes, made directly: per GPU its prepared calls, a GPM sample and metrics
    (the same ids, on samples of its own), the process list and an XID poll at the source's cadences."""

    def __init__(self, nvml_pkg: Any, source: Any):
        from trimtab.agent.nvml import source as source_module
        from trimtab.agent.nvml.tick import PROCESS_CALLS
        from trimtab.agent.nvml.xid import EVENT_WAIT, XID_EVERY_S

        nv = self.nv = nvml_pkg.load_pynvml()
        self.gpus = []
        for gpu, calls in source.tick_calls():
            gpm = None
            if gpu.gpm is not None:
                samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                requests = []
                for k in range(2):
                    request = nv.c_nvmlGpmMetricsGet_t()
                    request.version = nv.NVML_GPM_METRICS_GET_VERSION
                    request.sample1, request.sample2 = samples[1 - k], samples[k]
                    for i, metric_id in enumerate(gpu.gpm.ids):
                        request.metrics[i].metricId = metric_id
                    request.numMetrics = len(gpu.gpm.ids)
                    requests.append(request)
                gpm = [samples, requests]
            self.gpus.append((gpu.handle, [(fn, args) for _, fn, args in calls], gpm))
        self.processes = next(getattr(nv, n) for n in PROCESS_CALLS if hasattr(nv, n))
        self.event_wait = next(getattr(nv, n) for n in EVENT_WAIT if hasattr(nv, n))
        self.event_set = nv.nvmlEventSetCreate()
        for handle, _, _ in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self.event_set)
            except nv.NVMLError:
                pass
        self.processes_every_s, self.xid_every_s = source_module.PROCESSES_EVERY_S, XID_EVERY_S
        self._procs_due = self._xid_due = 0.0
        self._turn, self._based = 0, False

    def tick(self) -> None:
        nv, turn = self.nv, self._turn
        now = time.monotonic()
        procs = now >= self._procs_due
        if procs:
            self._procs_due = now + self.processes_every_s
        for handle, calls, gpm in self.gpus:
            for fn, args in calls:
                fn(*args)
            if procs:
                self.processes(handle)
            if gpm is not None:
                nv.nvmlGpmSampleGet(handle, gpm[0][turn])
                if self._based:
                    nv.nvmlGpmMetricsGet(gpm[1][turn])
        self._turn, self._based = 1 - turn, True
        if now >= self._xid_due:
            self._xid_due = now + self.xid_every_s
            try:
                self.event_wait(self.event_set, 0)
            except nv.NVMLError:  # TIMEOUT: no event waiting
                pass

    def each_call_alone(self, repeat: int = 100) -> dict:
        """Each call of GPU 0's tick alone in a tight loop: µs per call (warm)."""
        nv = self.nv
        handle, calls, gpm = self.gpus[0]
        named = [(getattr(fn, "__name__", str(fn)), fn, args) for fn, args in calls]
        named.append(("processes", self.processes, (handle,)))
        if gpm is not None:
            named += [("nvmlGpmSampleGet", nv.nvmlGpmSampleGet, (handle, gpm[0][0])),
                      ("nvmlGpmMetricsGet", nv.nvmlGpmMetricsGet, (gpm[1][0],))]
        out = {}
        for name, fn, args in named:
            times, failed = [], 0
            for _ in range(repeat):
                started = time.perf_counter()
                try:
                    fn(*args)
                except nv.NVMLError:
                    failed += 1
                times.append(time.perf_counter() - started)
            out[name] = {**us_stats(times), "failed": failed}
        return out

    def close(self) -> None:
        nv = self.nv
        for _, _, gpm in self.gpus:
            for sample in (gpm[0] if gpm else ()):
                nv.nvmlGpmSampleFree(sample)
        nv.nvmlEventSetFree(self.event_set)


def _ratio(a, b):
    return a / b if a is not None and b else None


def side_by_side(source: Any, without: Any, bare: BareTick, ticks: int, hz: float, how: str,
                 stop_at: float = math.inf) -> dict:
    """Bare, ours and ours without the per-process call take turns, ``ticks`` each (fewer if ``stop_at`` comes
    first), after the same wait; per GPU per tick."""
    n = max(1, len(bare.gpus))
    spent_s: list[list[float]] = [[], [], []]
    gpm_ticks = [0]
    warm = 2  # the first GPM sample of each side has nothing to compare with

    def tick(k: int) -> None:
        side, i = k % 3, k // 3
        started = time.perf_counter()
        if side == 0:
            bare.tick()
        else:
            readings = (source if side == 1 else without).sample(int(time.time() * 1000))
        spent = (time.perf_counter() - started) / n
        if i < warm:
            return
        spent_s[side].append(spent)
        if side == 1:
            gpm_ticks[0] += any(s.sm_active_pct is not None for s in readings.gpu_samples)

    ran = paced(3 * (ticks + warm), hz, how, tick, stop_at)
    b, o, w = (us_stats(x) for x in spent_s)
    return {"wait": how, "ticks_each": min(len(x) for x in spent_s), "cut_short": ran < 3 * (ticks + warm),
            "bare": b, "ours": o, "ours_without_activity": w,
            "ours_ticks_with_gpm": gpm_ticks[0],
            "ratio_median": _ratio(o["median_us"], b["median_us"]), "ratio_p99": _ratio(o["p99_us"], b["p99_us"]),
            "ours_minus_bare_median_us": o["median_us"] - b["median_us"] if b["median_us"] else None,
            "activity_ratio_median": _ratio(o["median_us"], w["median_us"]),
            "activity_ratio_p99": _ratio(o["p99_us"], w["p99_us"]),
            "activity_added_median_us": o["median_us"] - w["median_us"] if w["median_us"] else None}


def bench_naive(nv: Any, handles: list, ticks: int, hz: float) -> dict:
    """The cheap calls plus the blocking PCIe counter on the tick, straight through the bindings."""
    temperature = getattr(nv, "nvmlDeviceGetTemperatureV", nv.nvmlDeviceGetTemperature)
    calls = [
        lambda h: nv.nvmlDeviceGetUtilizationRates(h),
        lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        lambda h: nv.nvmlDeviceGetPowerUsage(h),
        lambda h: temperature(h, nv.NVML_TEMPERATURE_GPU),
        lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        lambda h: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
        lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
    ]
    ticks_s: list[float] = []

    def tick(_k: int) -> None:
        started = time.perf_counter()
        for h in handles:
            for call in calls:
                try:
                    call(h)
                except nv.NVMLError:
                    pass
        ticks_s.append((time.perf_counter() - started) / len(handles))

    paced(ticks, hz, "sleep", tick)
    return {"tick_per_gpu": us_stats(ticks_s)}


# -- report --------------------------------------------------------------------------------------------------------

def _fmt(x) -> str:
    return "—" if x is None else f"{x:,.1f}"


def print_report(r: dict) -> None:
    inv = r["inventory"]
    if r["fake_nvml"]:
        print("FAKE NVML: the real pynvml bindings over a no-cost stand-in for libnvidia-ml (every call returns at "
              "once).\nBare = the bindings' own Python; ours - bare = trimtab's own Python per GPU per tick. These "
              "are not NVML costs.")
    print(f"driver {inv['driver']}, NVML {inv['nvml']}; {len(inv['gpus'])} GPU(s):")
    for g in inv["gpus"]:
        print(f"  GPU {g['index']}: {g['name']}, GPM {'yes' if g['gpm'] else 'no'}, NVLink links {g['nvlink_links']}")
    print(f"\nper GPU per tick (µs), bare, ours and ours without the per-process read taking turns at {r['hz']:g} "
          f"Hz, {r['ticks']} ticks each (ours reads per-process utilization off the tick every "
          f"{r['activity_every_s']:g} s with {r['activity_call'] or 'nothing: unsupported'}):")
    print(f"  {'':44}{'median':>10}{'p99':>10}{'max':>10}")
    for run in r["runs"]:
        for label, s in ((f"wait={run['wait']}: bare NVML calls", run["bare"]),
                         (f"wait={run['wait']}: ours sample()", run["ours"]),
                         (f"wait={run['wait']}: ours without per-process", run["ours_without_activity"])):
            print(f"  {label:44}{_fmt(s['median_us']):>10}{_fmt(s['p99_us']):>10}{_fmt(s['max_us']):>10}")
        ratio = run["ratio_median"]
        verdict = "within" if ratio is not None and ratio <= GOAL_RATIO else "NOT within"
        print(f"  {'  ratio ours/bare':44}{_fmt(ratio):>9}×{_fmt(run['ratio_p99']):>9}×   "
              f"({verdict} {GOAL_RATIO:g}×; ours - bare {_fmt(run['ours_minus_bare_median_us'])} µs;"
              f" ours took GPM on {run['ours_ticks_with_gpm']}/{run['ticks_each']} ticks)")
        ratio = run["activity_ratio_median"]
        verdict = "within" if ratio is not None and ratio <= GOAL_ACTIVITY_RATIO else "NOT within"
        print(f"  {'  ratio ours/ours without per-process':44}{_fmt(ratio):>9}×{_fmt(run['activity_ratio_p99']):>9}×"
              f"   ({verdict} {GOAL_ACTIVITY_RATIO:g}×; the tick with the read on its thread "
              f"{_fmt(run['activity_added_median_us'])} µs longer)")
    print("\neach bare call alone, tight loop (µs per call, warm): " + " · ".join(
        f"{name} {_fmt(s['median_us'])}" + (f" ({s['failed']} failed)" if s["failed"] else "")
        for name, s in r["each_call_alone"].items()))
    print_ways(r["activity_read"], _fmt)
    if r.get("naive"):
        s = r["naive"]["tick_per_gpu"]
        print(f"naive tick (the cheap calls + GetPcieThroughput TX/RX on the tick): median {_fmt(s['median_us'])} µs,"
              f" p99 {_fmt(s['p99_us'])} µs per GPU; {_fmt(r['naive_over_ours'])}× ours (wait=sleep)")
    print(f"unsupported: {', '.join(r['unsupported']) or 'none'}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=50, help="ticks of each side per wait mode")
    ap.add_argument("--hz", type=float, default=9.5, help="ticks per second, both sides together")
    ap.add_argument("--wait", choices=("sleep", "spin", "both"), default="both")
    ap.add_argument("--naive-ticks", type=int, default=20, help="the naive tick blocks ~42 ms per GPU; 0: skip it")
    ap.add_argument("--gpus", help="comma-separated NVML indices (default: all)")
    ap.add_argument("--fake-nvml", action="store_true",
                    help="no GPU: real bindings over a no-cost NVML stand-in, to measure trimtab's own overhead")
    ap.add_argument("--fake-gpus", type=int, default=8, help="GPUs of the stand-in")
    ap.add_argument("--activity-every", type=float, default=None,
                    help="seconds between the agent's per-process utilization reads (default: the agent's own)")
    ap.add_argument("--activity-calls", type=int, default=20,
                    help="calls of each way to read per-process utilization, per GPU")
    ap.add_argument("--budget-s", type=float, default=45.0,
                    help="the most seconds the timed ticks may take, all wait modes together (then they stop)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    modes = ("sleep", "spin") if args.wait == "both" else (args.wait,)
    indices = [int(i) for i in args.gpus.split(",")] if args.gpus else None

    nvml, SourceUnavailable = _import_agent()
    from trimtab.agent.nvml.activity_reader import ACTIVITY_EVERY_S

    every_s = args.activity_every or ACTIVITY_EVERY_S
    if args.fake_nvml:
        install_no_cost_nvml(nvml.load_pynvml(), args.fake_gpus)
    try:
        source = nvml.NvmlSource(indices=indices, activity_every_s=every_s)
        without = nvml.NvmlSource(indices=indices, process_activity=False)
    except SourceUnavailable as exc:
        message = " ".join(str(exc).split())
        print(f"nvml_tick: cannot measure here ({message}); run it on a machine with an NVIDIA GPU and driver, or "
              f"with --fake-nvml for trimtab's own overhead", file=sys.stderr)
        return 2
    progress(f"{len(modes)} wait mode(s) x 3 sides x {args.ticks + 2} ticks at {args.hz:g} Hz: about "
             f"{len(modes) * 3 * (args.ticks + 2) / args.hz:.0f} s of ticks (at most {args.budget_s:g} s)")
    inv = source.inventory()
    bare = BareTick(nvml, source)
    progress(f"NVML up in {time.perf_counter() - started:.1f} s: {len(inv.gpus)} GPU(s); the per-process read off "
             f"the tick every {every_s:g} s")
    try:
        stop_at, runs = time.perf_counter() + args.budget_s, []
        for how in modes:
            runs.append(side_by_side(source, without, bare, args.ticks, args.hz, how, stop_at))
            run = runs[-1]
            cut = " (cut short by --budget-s)" if run["cut_short"] else ""
            progress(f"wait={how}: {run['ticks_each']} ticks a side{cut}, ours/bare {_fmt(run['ratio_median'])}x, "
                     f"ours/ours without per-process "
                     f"{_fmt(run['activity_ratio_median'])}x ({time.perf_counter() - started:.1f} s so far)")
        each = bare.each_call_alone()
        progress(f"each call alone timed ({time.perf_counter() - started:.1f} s so far)")
        ways = time_ways(bare.nv, [h for h, _, _ in bare.gpus], args.activity_calls, every_s, us_stats)
        progress(f"per-process read's ways timed: cheapest {ways['cheapest']} "
                 f"({time.perf_counter() - started:.1f} s so far)")
        picked = sorted({g.activity.function_name for g, _ in source.tick_calls()
                         if g.activity is not None and g.activity.supported} - {None})
        naive = None
        if args.naive_ticks and not args.fake_nvml:
            naive = bench_naive(bare.nv, [h for h, _, _ in bare.gpus], args.naive_ticks, args.hz)
            progress(f"naive tick timed ({time.perf_counter() - started:.1f} s so far)")
        unsupported = [f"gpu{i}:{m}" if i is not None else m for i, m in source.unsupported()]
    finally:
        bare.close()
        without.close()
        source.close()
    sleep_runs = [run for run in runs if run["wait"] == "sleep"] or runs
    ours_med = sleep_runs[0]["ours"]["median_us"]
    result = {
        "fake_nvml": args.fake_nvml, "hz": args.hz, "ticks": args.ticks,
        "inventory": {"driver": inv.driver_version, "nvml": inv.nvml_version,
                      "gpus": [{"index": g.index, "name": g.name, "gpm": g.gpm_supported,
                                "nvlink_links": g.nvlink_link_count} for g in inv.gpus]},
        "runs": runs, "each_call_alone": each, "naive": naive,
        "naive_over_ours": naive["tick_per_gpu"]["median_us"] / ours_med if naive and ours_med else None,
        "goal_ratio": GOAL_RATIO,
        "goal_met": all(run["ratio_median"] is not None and run["ratio_median"] <= GOAL_RATIO for run in runs),
        "activity_call": ", ".join(picked) or None, "activity_every_s": every_s, "activity_read": ways,
        "goal_activity_ratio": GOAL_ACTIVITY_RATIO,
        "activity_goal_met": all(run["activity_ratio_median"] is not None
                                 and run["activity_ratio_median"] <= GOAL_ACTIVITY_RATIO for run in runs),
        "activity_failed_calls": source.activity_failed_calls(),
        "unsupported": unsupported,
    }
    if args.json:
        print(json.dumps(result, indent=2, default=str), flush=True)
    else:
        print_report(result)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
