"""From a job's window to :func:`trimtab.control.placement.propose_placement`'s inputs: per-GPU load from the
agent's samples, per-component load from the hook's phase times.

The phase → component mapping is an estimate, stated in the advice's evidence: generation runs on the generation
copy ("rollout", else the actor's GPUs), scoring time is split evenly between reward, critic and reference, and the
update belongs to the actor and the critic.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any, Optional, Sequence

from trimtab.grading.signals import mem_used_pct, step_share_pct, time_base
from trimtab.control.placement import GpuLoad, propose_placement
from trimtab.grading.window import JobStep

SCORERS = ("reward", "critic", "ref")


def component_shares(device_map: dict[str, list[int]], steps: Sequence[JobStep]) -> dict[str, float]:
    """Each declared component's estimated share of a step's busy time (fractions), on the time the rules grade
    (GPU time where the steps carry it)."""
    base = time_base(steps)

    def mean_share(phase: str) -> float:
        values = [step_share_pct(s, phase, base) for s in steps]
        known = [v for v in values if v is not None]
        return statistics.fmean(known) / 100.0 if known else 0.0

    gen, ev, upd = mean_share("generation"), mean_share("evaluation"), mean_share("update")
    shares: dict[str, float] = {}
    generator = "rollout" if "rollout" in device_map else "actor"
    shares[generator] = shares.get(generator, 0.0) + gen
    if "actor" in device_map:
        shares["actor"] = shares.get("actor", 0.0) + (upd / 2 if "critic" in device_map else upd)
    scorers = [c for c in SCORERS if c in device_map]
    for name in scorers:
        shares[name] = shares.get(name, 0.0) + ev / len(scorers)
    if "critic" in device_map:
        shares["critic"] = shares.get("critic", 0.0) + upd / 2
    return {k: v for k, v in shares.items() if k in device_map}


def placement_for(state, readings, win: Sequence[JobStep]) -> Optional[dict[str, Any]]:
    """The placement proposal for the window as a JSON-able dict, or None (no better placement, or no data)."""
    device_map = {k: list(v) for k, v in state.job.device_map.items()}
    if not device_map:
        return None
    windows = state.gpus(win[0].start_ms, win[-1].end_ms)
    loads = []
    for g in windows:
        busy = g.mean.get("sm_active_pct")
        if busy is None:
            busy = g.mean.get("util_pct")
        loads.append(GpuLoad(index=g.gpu_index, busy_pct=busy, mem_used_pct=mem_used_pct(g),
                             mem_total_bytes=g.mean.get("mem_total_bytes")))
    if not loads:
        return None
    advice = propose_placement(device_map, loads, component_shares(device_map, win))
    if advice is None:
        return None
    out = asdict(advice)
    out["assumption"] = __doc__.split("\n\n")[1].replace("\n", " ")
    return out
