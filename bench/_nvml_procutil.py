"""The per-process utilization read's own cost (``bench/nvml_tick.py``): every way the agent could make it — both
NVML functions (``nvmlDeviceGetProcessesUtilizationInfo``, ``nvmlDeviceGetProcessUtilization``), each in one C
call and through pynvml's two-call wrapper (``trimtab.agent.nvml.procutil``) — timed per call as the agent reads,
each way with its own ``lastSeenTimeStamp`` moved on to its newest record, the ways taking turns. Then the cost
amortized over the agent's cadence (one read per GPU every ``every_s``): µs per second per GPU and the share of one
CPU core that is, and whether the ways saw the same processes (the same data).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def time_ways(nv: Any, handles: list, calls: int, every_s: float, stats: Callable[[list], dict]) -> dict:
    """Per way: µs per call (``stats`` of the timings), records per call, failed calls, the pids seen, and the
    amortized cost at ``every_s``; plus which way the agent would keep (the cheapest median that answered)."""
    from trimtab.agent.nvml.procutil import candidates
    from trimtab.agent.nvml.structs import field_reader
    from trimtab.agent.nvml.procutil import RECORD_STRUCTS

    ways = candidates(nv)
    if not ways:
        return {"ways": {}, "cheapest": None, "every_s": every_s}
    state = {w.label: {"times": [], "records": [], "failed": 0, "pids": set(), "last_seen": [0] * len(handles),
                       "error": None} for w in ways}
    readers = {}
    for w in ways:
        struct_name, names = RECORD_STRUCTS[w.function]
        readers[w.label] = (field_reader(getattr(nv, struct_name), names), names[0] == "timeStamp")
    for _ in range(calls):
        for w in ways:  # the ways take turns, so each sees the same load
            st = state[w.label]
            fields, stamp_first = readers[w.label]
            for k, handle in enumerate(handles):
                started = time.perf_counter()
                try:
                    got = w.call(handle, st["last_seen"][k])
                    values = [fields(r) for r in got]
                except nv.NVMLError as exc:
                    values = []
                    if exc.value != nv.NVML_ERROR_NOT_FOUND:
                        st["failed"] += 1
                        st["error"] = str(exc)
                st["times"].append(time.perf_counter() - started)
                st["records"].append(len(values))
                for a, b, _, _ in values:
                    pid, stamp = (b, a) if stamp_first else (a, b)
                    st["pids"].add(int(pid))
                    st["last_seen"][k] = max(st["last_seen"][k], int(stamp))
    out = {}
    for w in ways:
        st = state[w.label]
        s = stats(st["times"])
        answered = st["failed"] < len(st["times"])
        per_s = s["median_us"] / every_s if s["median_us"] is not None else None
        out[w.label] = {**s, "function": w.function, "failed": st["failed"], "error": st["error"],
                        "answered": answered, "records_median": statistics.median(st["records"]),
                        "pids": sorted(st["pids"]), "amortized_us_per_s_per_gpu": per_s,
                        "core_share_per_gpu": per_s / 1e6 if per_s is not None else None}
    answering = [label for label in out if out[label]["answered"]]
    cheapest = min(answering, key=lambda label: out[label]["median_us"]) if answering else None
    pid_sets = {tuple(out[label]["pids"]) for label in answering}
    return {"ways": out, "cheapest": cheapest, "every_s": every_s, "calls": calls, "gpus": len(handles),
            "same_processes": len(pid_sets) <= 1}


def print_ways(r: dict, fmt: Callable[[Any], str]) -> None:
    """The per-process read's section of the report."""
    if not r["ways"]:
        print("\nper-process utilization read: no way to make it in these bindings")
        return
    print(f"\nper-process utilization read, off the tick (the agent's thread, one call per GPU every {r['every_s']:g} s;"
          f" each way {r['calls']} calls a GPU, taking turns, each from its own newest record):")
    print(f"  {'way':56}{'median µs':>11}{'p99 µs':>10}{'records':>9}{'µs/s/GPU':>10}{'core %/GPU':>11}")
    cheapest = r["ways"].get(r["cheapest"]) if r["cheapest"] else None
    for label, w in r["ways"].items():
        share = w["core_share_per_gpu"]
        note = "" if w["answered"] else f"   (failed: {w['error']})"
        print(f"  {label:56}{fmt(w['median_us']):>11}{fmt(w['p99_us']):>10}{fmt(w['records_median']):>9}"
              f"{fmt(w['amortized_us_per_s_per_gpu']):>10}{'—' if share is None else f'{share * 100:.3f}':>11}{note}")
    if cheapest is not None:
        ratios = " · ".join(f"{label} {fmt(w['median_us'] / cheapest['median_us'])}×" for label, w in r["ways"].items()
                            if w["answered"] and cheapest["median_us"])
        print(f"  cheapest: {r['cheapest']} (the agent picks it at its first read, timing each way); each way's "
              f"median over the cheapest's: {ratios}")
    print(f"  the ways saw the same processes: {'yes' if r['same_processes'] else 'NO'}")
