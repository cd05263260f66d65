"""Placement advice for one job: a better ``device_map`` when the job's GPUs are unevenly busy.

An RL job's reference layout keeps the I/O-heavy scoring components (reward, critic) and the reference model apart
from generation so that they do not fight over the same GPUs, and a sustained busy spread across the job's GPUs (the
utilization_spread rule) means the ``device_map`` should be checked. This module turns that into one concrete,
*advisory* change: move one component (or swap two) so that the estimated busy spread shrinks. Nothing here applies
the change — a placement change needs a restart of the job's workers — so the result is a proposal a person reads.

The model, and the assumptions it rests on:

* **Load is additive per GPU.** Components that share a GPU time-slice it; the GPU's measured busy % (SM activity,
  else NVML utilization, mean over the window) is the sum of its components' busy points. Moving a component
  subtracts its points from the GPUs it leaves and adds them to the GPUs it lands on. Phases of different components
  may overlap in time (generation of batch *n+1* while batch *n* is scored); that is fine for this model because it
  counts busy points per GPU, not wall time per step.
* **Component shares split evenly over a component's GPUs.** ``component_share[c]`` is ``c``'s fraction of busy time
  per step (from the hook's phases; shares need not sum to 1). A component on *n* GPUs contributes ``share/n`` to each
  (FSDP / data parallel split work evenly).
* **Calibrated to what NVML saw.** On each GPU the measured busy % is divided among its components in proportion to
  those raw shares, so the estimates sum to the measurement exactly. Where a GPU also hosts a component of unknown
  share, the known ones get ``k * share/n`` points, with ``k`` (points per unit share) fitted on the GPUs whose
  components are all known; the rest of that GPU's busy is pinned to the unknown components. Components of unknown
  load are never moved.
* **A component's GPU time is conserved when it moves.** Its total busy points (summed over its GPUs) are spread
  evenly over its new GPUs; moving from two GPUs to one doubles its points on that GPU. This is first order: it
  ignores the step time changing after the move (that is the point of the move, and it would shift every GPU's %).
* **Memory is estimated from the same split.** A component's memory on a GPU is that GPU's ``mem_used_pct`` times the
  component's fraction of the GPU's estimated busy points (crude: a reward model's weights are not proportional to
  its busy time, so the check errs either way), conserved in bytes when it moves (converted between GPU sizes when
  ``mem_total_bytes`` is known, else GPUs are assumed equal in size) and spread evenly over its new GPUs. A move is
  never proposed when a receiving GPU's estimated memory would exceed ``memory_limit_pct``; where memory is unknown
  the move is not checked, and the advice says so.
* **A receiving GPU may not saturate.** A change that puts an estimated > 100 % busy on a GPU is discarded: that GPU
  would become the bottleneck and the spread figure would mean nothing.
* **The actor stays.** The actor's (and any ``actor*`` fused worker's) GPUs are the user's FSDP choice and are never
  moved. Every other component with known load (reward, critic, ref, rollout …) may move to any GPU of the job, or
  to an idle GPU in ``available_gpus``, keeping its GPU count or shrinking to one GPU; two such components may swap.
* **Spread is max − min busy** over the job's GPUs plus the usable ``available_gpus`` (an available GPU left idle is
  part of the imbalance the job could use). One change is proposed: the one with the lowest estimated spread; ties go
  to the fewer moved components, then component name, then GPU indices, so the answer is deterministic.

No proposal (``None``) when data are missing (a GPU of the job without a busy %) or when no change cuts the estimated
spread by at least ``min_reduction_pts`` (10 points by default). Pure Python: no torch, no store, no web framework.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Mapping, Optional, Sequence

MIN_REDUCTION_PTS = 10.0
_EPS = 1e-9

__all__ = ["GpuLoad", "PlacementAdvice", "propose_placement", "MIN_REDUCTION_PTS"]


@dataclass(frozen=True)
class GpuLoad:
    index: int                      # local GPU index
    busy_pct: Optional[float]       # mean SM activity (or utilization) over the window, 0-100; None = unknown
    mem_used_pct: Optional[float]   # (used+reserved)/total in %, None = unknown
    mem_total_bytes: Optional[float] = None


@dataclass(frozen=True)
class PlacementAdvice:
    device_map: dict[str, list[int]]        # the proposed map (component -> local GPU indices)
    moves: list[str]                        # human sentences, one per moved component
    expected_spread_pts_before: float       # estimated busy spread across the job's GPUs now
    expected_spread_pts_after: float        # estimated after the proposal
    expected_effect: str                    # one or two sentences for a person: what should improve, why, numbers
    evidence: dict                          # the inputs summarised, JSON-serialisable


def is_actor(component: str) -> bool:
    """The actor (and fused ``actor_rollout``/``actor_rollout_ref`` workers): never moved by this module."""
    return component.lower().startswith("actor")


def _finite(x) -> Optional[float]:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _gpus_text(indices: Sequence[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def _r(x: Optional[float], nd: int = 1) -> Optional[float]:
    return None if x is None else round(x + 0.0, nd)


@dataclass
class _Model:
    dm: dict[str, tuple[int, ...]]              # component -> sorted GPUs
    busy: dict[int, float]                      # considered GPU -> measured busy %
    mem: dict[int, Optional[float]]             # considered GPU -> measured memory %
    total: dict[int, Optional[float]]           # considered GPU -> memory size in bytes
    load: dict[str, dict[int, float]]           # estimated busy points of a component on each of its GPUs
    mem_pct: dict[str, dict[int, float]]        # estimated memory % of a component on each of its GPUs
    share: dict[str, Optional[float]]
    pinned: dict[str, str]                      # component -> why it is not moved
    k: Optional[float]                          # busy points per unit share (calibration)

    def load_total(self, c: str) -> float:
        return sum(self.load[c].values())

    def mem_total(self, c: str) -> tuple[Optional[float], Optional[float]]:
        """(bytes, %-points) of a component summed over its GPUs; None where unknown."""
        pct = self.mem_pct.get(c)
        if pct is None or set(pct) != set(self.dm[c]):
            return None, None
        pts = sum(pct.values())
        if all(self.total.get(g) for g in pct):
            return sum(p / 100.0 * self.total[g] for g, p in pct.items()), pts
        return None, pts


def _estimate(dm: dict[str, tuple[int, ...]], by_idx: Mapping[int, GpuLoad], considered: Sequence[int],
              component_share: Mapping[str, float]) -> _Model:
    share: dict[str, Optional[float]] = {}
    for c in dm:
        v = _finite(component_share.get(c)) if c in component_share else None
        share[c] = v if v is not None and v >= 0 else None
    busy = {g: min(100.0, max(0.0, float(by_idx[g].busy_pct))) for g in considered}
    mem = {g: _finite(by_idx[g].mem_used_pct) for g in considered}
    total = {g: (_finite(by_idx[g].mem_total_bytes) or None) for g in considered}
    raw = {c: {g: share[c] / len(gpus) for g in gpus} for c, gpus in dm.items() if share[c] is not None}
    on_gpu = {g: sorted(c for c, gpus in dm.items() if g in gpus) for g in considered}

    # k: busy points per unit share, fitted on the GPUs whose components all have a known share.
    num = den = 0.0
    for g, comps in on_gpu.items():
        if comps and all(c in raw for c in comps):
            s = sum(raw[c][g] for c in comps)
            if s > 0:
                num += busy[g]
                den += s
    k = num / den if den > 0 else None

    load: dict[str, dict[int, float]] = {c: {} for c in raw}
    weight: dict[str, dict[int, float]] = {c: {} for c in raw}  # fraction of the GPU's memory that is c's
    pinned: dict[str, str] = {}
    for c in sorted(dm):
        if is_actor(c):
            pinned[c] = "actor: training placement is the user's FSDP choice"
        elif c not in raw:
            pinned[c] = "load unknown (no share for it)"
    for g, comps in on_gpu.items():
        known = [c for c in comps if c in raw]
        if not known:
            continue
        s = sum(raw[c][g] for c in known)
        if len(known) == len(comps):
            for c in known:
                load[c][g] = busy[g] * raw[c][g] / s if s > 0 else 0.0
                weight[c][g] = raw[c][g] / s if s > 0 else 1.0 / len(known)
        elif k is not None:
            est = {c: k * raw[c][g] for c in known}
            tot = sum(est.values())
            scale = busy[g] / tot if tot > busy[g] else 1.0  # never attribute more than the GPU was busy
            for c in known:
                load[c][g] = est[c] * scale
                weight[c][g] = load[c][g] / busy[g] if busy[g] > 0 else 0.0
        else:
            for c in known:
                pinned.setdefault(c, f"load on GPU {g} not separable from components of unknown load")
    for c in list(load):
        if set(load[c]) != set(dm[c]):  # some GPU of c could not be estimated
            pinned.setdefault(c, "load not estimable on all of its GPUs")
            load[c] = {g: load[c].get(g, 0.0) for g in dm[c]}
    mem_pct: dict[str, dict[int, float]] = {}
    for c in weight:
        if all(mem[g] is not None and g in weight[c] for g in dm[c]):
            mem_pct[c] = {g: mem[g] * weight[c][g] for g in dm[c]}
    return _Model(dm=dm, busy=busy, mem=mem, total=total, load=load, mem_pct=mem_pct, share=share,
                  pinned=pinned, k=k)


@dataclass
class _Outcome:
    change: dict[str, tuple[int, ...]]
    busy: dict[int, float]
    mem: dict[int, Optional[float]]
    spread: float
    mem_unchecked: list[str]
    rejected: Optional[str]


def _apply(m: _Model, change: Mapping[str, tuple[int, ...]], limit: float) -> _Outcome:
    busy = dict(m.busy)
    mem = dict(m.mem)
    for c in change:
        for g in m.dm[c]:
            busy[g] -= m.load[c][g]
            if mem[g] is not None:
                mem[g] = mem[g] - m.mem_pct[c][g] if c in m.mem_pct else None
    receiving: set[int] = set()
    unchecked: list[str] = []
    for c, tgt in change.items():
        per = m.load_total(c) / len(tgt)
        b_total, pts = m.mem_total(c)
        for g in tgt:
            busy[g] += per
            receiving.add(g)
            if mem[g] is None or pts is None:
                mem[g] = None
                unchecked.append(f"{c} → GPU {g}")
            elif b_total is not None and m.total.get(g):
                mem[g] += b_total / len(tgt) / m.total[g] * 100.0
            else:
                mem[g] += pts / len(tgt)
    rejected = None
    for g in sorted(receiving):
        if busy[g] > 100.0 + _EPS:
            rejected = f"GPU {g} would be {busy[g]:.0f}% busy (saturated)"
            break
        if mem[g] is not None and mem[g] > limit + _EPS:
            rejected = f"GPU {g} memory would be {mem[g]:.0f}% > limit {limit:g}%"
            break
    vals = list(busy.values())
    return _Outcome(change=dict(change), busy=busy, mem=mem, spread=max(vals) - min(vals),
                    mem_unchecked=sorted(set(unchecked)), rejected=rejected)


def _candidates(m: _Model, targets: Sequence[int]) -> list[dict[str, tuple[int, ...]]]:
    movable = sorted(c for c in m.dm if c not in m.pinned)
    out: list[dict[str, tuple[int, ...]]] = []
    for c in movable:
        cur = m.dm[c]
        for size in sorted({1, len(cur)}):
            for combo in combinations(targets, size):
                if combo != cur:
                    out.append({c: combo})
    for a, b in combinations(movable, 2):
        if m.dm[a] != m.dm[b]:
            out.append({a: m.dm[b], b: m.dm[a]})
    return out


def propose_placement(device_map: Mapping[str, Sequence[int]], gpus: Sequence[GpuLoad],
                      component_share: Mapping[str, float], *, available_gpus: Optional[Sequence[int]] = None,
                      memory_limit_pct: float = 90.0,
                      min_reduction_pts: float = MIN_REDUCTION_PTS) -> Optional[PlacementAdvice]:
    """One advisory change to ``device_map`` that evens out the job's GPU load, or None (see the module docstring).

    ``gpus`` may list more GPUs than the job uses; only the job's GPUs and the idle ones named in ``available_gpus``
    (with a known busy %) are considered. ``min_reduction_pts`` is the smallest spread cut worth a restart.
    """
    dm = {str(c): tuple(sorted({int(i) for i in idx})) for c, idx in device_map.items()}
    dm = {c: g for c, g in dm.items() if g}
    if not dm:
        return None
    by_idx: dict[int, GpuLoad] = {}
    for g in gpus:
        if int(g.index) in by_idx:
            raise ValueError(f"GPU {g.index} listed twice in gpus")
        by_idx[int(g.index)] = g
    job = sorted({i for idx in dm.values() for i in idx})
    if any(i not in by_idx or _finite(by_idx[i].busy_pct) is None for i in job):
        return None  # missing data: the caller says "no placement advice"
    extra = sorted({int(i) for i in (available_gpus or ())} - set(job))
    usable = [i for i in extra if i in by_idx and _finite(by_idx[i].busy_pct) is not None]
    skipped = [i for i in extra if i not in usable]
    considered = sorted(job + usable)

    m = _estimate(dm, by_idx, considered, component_share)
    before = max(m.busy.values()) - min(m.busy.values())
    n_candidates = n_rejected = 0
    best: Optional[tuple[tuple, _Outcome]] = None
    best_rejected: Optional[tuple[tuple, _Outcome]] = None
    if before >= min_reduction_pts:
        for change in _candidates(m, considered):
            n_candidates += 1
            out = _apply(m, change, memory_limit_pct)
            key = (round(out.spread, 6), len(change), tuple(sorted(change)),
                   tuple(change[c] for c in sorted(change)))
            if out.rejected:
                n_rejected += 1
                if best_rejected is None or key < best_rejected[0]:
                    best_rejected = (key, out)
                continue
            if best is None or key < best[0]:
                best = (key, out)

    evidence = _evidence(m, job, usable, skipped, before, n_candidates, n_rejected, memory_limit_pct,
                         min_reduction_pts, best[1] if best else None, best_rejected)
    if best is None or before - best[1].spread < min_reduction_pts - _EPS:
        return None
    out = best[1]
    new_map = {c: list(out.change.get(c, gpus_)) for c, gpus_ in sorted(dm.items())}
    moves = []
    for c in sorted(out.change):
        pts = m.load_total(c)
        moves.append(f"move {c} from {_gpus_text(dm[c])} to {_gpus_text(out.change[c])} "
                     f"(about {pts:.0f} busy points of GPU time)")
    return PlacementAdvice(device_map=new_map, moves=moves, expected_spread_pts_before=round(before, 1),
                           expected_spread_pts_after=round(out.spread, 1),
                           expected_effect=_effect(m, out, before, considered), evidence=evidence)


def _effect(m: _Model, out: _Outcome, before: float, considered: Sequence[int]) -> str:
    changed = [g for g in considered if abs(out.busy[g] - m.busy[g]) > 0.05]
    per_gpu = ", ".join(f"GPU {g} {m.busy[g]:.0f}→{out.busy[g]:.0f}%" for g in changed)
    if len(out.change) == 1:
        (c, tgt), = out.change.items()
        others = sorted({o for o, idx in m.dm.items() if o != c and set(idx) & set(m.dm[c])})
        with_ = " and ".join([", ".join(others[:-1]), others[-1]] if len(others) > 1 else others) or "other work"
        why = (f"{c} stops time-sharing {_gpus_text(m.dm[c])} with {with_} and runs "
               f"where there was idle capacity")
    else:
        a, b = sorted(out.change)
        why = f"{a} and {b} trade GPUs, so the heavier of the two lands where there was idle capacity"
    text = (f"Estimated, not measured: the busy spread across {_gpus_text(list(considered))} should drop from "
            f"{before:.0f} to {out.spread:.0f} points ({per_gpu}) because {why}. The estimate assumes busy time "
            f"adds up per GPU and a component's GPU time is conserved when it moves; check it with a new window "
            f"after restarting the job with this device_map.")
    if out.mem_unchecked:
        text += f" Memory was not checked for {', '.join(out.mem_unchecked)} (unknown)."
    return text


def _evidence(m: _Model, job: Sequence[int], usable: Sequence[int], skipped: Sequence[int], before: float,
              n_candidates: int, n_rejected: int, limit: float, min_reduction: float,
              best: Optional[_Outcome], best_rejected) -> dict:
    gpus = []
    for g in sorted(m.busy):
        row = {"index": g, "role": "job" if g in job else "available", "busy_pct": _r(m.busy[g]),
               "mem_used_pct": _r(m.mem[g]), "components": sorted(c for c, idx in m.dm.items() if g in idx)}
        if best is not None:
            row["estimated_busy_pct_after"] = _r(best.busy[g])
            row["estimated_mem_pct_after"] = _r(best.mem[g])
        gpus.append(row)
    comps = []
    for c in sorted(m.dm):
        b_total, pts = m.mem_total(c) if c in m.load else (None, None)
        comps.append({
            "name": c, "gpus": list(m.dm[c]), "share": m.share[c],
            "estimated_busy_pts": ({str(g): _r(v) for g, v in sorted(m.load[c].items())} if c in m.load else None),
            "estimated_mem_pct": ({str(g): _r(v) for g, v in sorted(m.mem_pct[c].items())}
                                  if c in m.mem_pct else None),
            "estimated_mem_bytes": _r(b_total, 0),
            "movable": c not in m.pinned, "pinned_because": m.pinned.get(c),
        })
    ev = {
        "model": "additive busy per GPU; shares split evenly over a component's GPUs, calibrated to measured busy; "
                 "memory split like busy; a component's GPU time and memory are conserved when it moves",
        "gpus": gpus, "components": comps, "points_per_unit_share": _r(m.k, 2),
        "spread_pts_before": _r(before), "spread_over_gpus": sorted(m.busy),
        "available_gpus_skipped_no_data": list(skipped), "memory_limit_pct": limit,
        "min_reduction_pts": min_reduction, "candidates_considered": n_candidates,
        "candidates_rejected": n_rejected,
    }
    if best is not None:
        ev["best_spread_pts_after"] = _r(best.spread)
    if best_rejected is not None and (best is None or best_rejected[1].spread < best.spread - _EPS):
        r = best_rejected[1]
        ev["better_change_rejected"] = {"change": {c: list(v) for c, v in sorted(r.change.items())},
                                        "spread_pts_after": _r(r.spread), "why": r.rejected}
    return ev
