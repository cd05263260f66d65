"""What a batch knob's value will need in memory, from what the job has shown: the allocator peak of each stretch of
steps between two memory samples, fitted against the knob's value and the tokens per sample the steps ran at —

    peak = base + value × (per_sample + per_token × tokens_per_sample)

— so a job whose sequences grow is seen needing more memory at the same batch size, and the length's trend says
how much more it will need soon. A token-budget knob (``contract.knobs.is_token_budget``: its value is tokens in
flight) is fitted as base + per_token × value, whatever the length. The fit keeps running as the job runs: each
stretch is weighted by its age (``memory_fit_half_life_s`` of step time), so memory that moves is followed.

Where the evidence cannot tell two terms apart the fit takes the larger prediction, never the smaller: one value
seen puts the base into the per-sample memory (an upper bound for a larger value); lengths that barely moved
(under ``memory_min_length_spread_pct``) put the per-sample memory into the per-token one (an upper bound for a
longer length); several values whose peaks did not grow are flat (the largest peak). The prediction's margin is
``memory_margin_pct`` of the GPU plus the fit's largest recent under-prediction.

Memory the job does not own lowers the line: where the job reports the GPU's free memory as it sees it
(``free_bytes``), what is neither free nor the job's own reserved memory is another process's (a neighbour that
took half the GPU mid-run), and the line is ``memory_line_pct`` of the GPU less that (``others_bytes``, the most of
the newest ``OTHERS_READINGS`` readings: a neighbour still allocating reads low once). Each stretch is labelled with
the knob value its steps report they ran at (``knobs``): the hook's own OOM halving records no change, and the
steps after it were labelled with the size that failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from trimtab.contract.knobs import is_token_budget
from trimtab.contract.statuses import APPLIED
from trimtab.grading.rules import ControllerSettings
from trimtab.grading.window import JobStep
from trimtab.store.changes import StoredChange

GIB = 2**30
RECENT_WEIGHT = 0.25  # the fit's miss is read on stretches at least this recent (two half-lives)
OTHERS_READINGS = 3  # memory others hold: the most of this many newest readings
NEWEST_STEPS = 3     # the length now is never below the mean of this many newest steps' tokens per sample
SPREAD_MIN_STEPS = 8  # the lengths' step-to-step spread is read on at least this many newest steps


def knob_history(changes: Sequence[StoredChange], knob: str, now_value: float):
    """step → the knob's value at that step, from the applied changes (``changes`` newest first)."""
    applied = sorted((c for c in changes if c.knob == knob and c.status == APPLIED and c.applied_step is not None),
                     key=lambda c: c.applied_step)

    def at(step: int) -> Optional[float]:
        value = float(applied[0].previous_value) if applied and applied[0].previous_value is not None else None
        if not applied:
            return now_value
        for c in applied:
            if c.applied_step <= step:
                value = float(c.value)
        return value
    return at, {c.applied_step for c in applied}


def ran_at(step: JobStep, knob: str) -> Optional[float]:
    """The knob's value the step reports it ran at (None: the job does not report it)."""
    value = (step.reported.get("knobs") or {}).get(knob)
    return float(value) if isinstance(value, (int, float)) else None


def others_of(memory: Mapping[str, Any]) -> Optional[float]:
    """Memory of the GPU another process holds, from one reading: total − free − the job's own (reserved, else
    allocated, else the peak: reserved is what the allocator holds, and a larger own figure leaves less to the
    others); None without free memory and the capacity."""
    free, total = memory.get("free_bytes"), memory.get("total_bytes")
    if free is None or not total:
        return None
    own = next((memory[k] for k in ("reserved_bytes", "allocated_bytes", "peak_allocated_bytes")
                if memory.get(k) is not None), 0.0)
    return max(0.0, float(total) - float(free) - float(own))


def others_bytes(steps: Sequence[JobStep]) -> Optional[float]:
    """Memory of the job's GPU that another process holds: the most of the newest ``OTHERS_READINGS`` readings
    (``others_of``); None when the job reports no free memory."""
    seen: list[float] = []
    for s in reversed(steps):
        held = others_of(s.reported)
        if held is not None:
            seen.append(held)
        if len(seen) >= OTHERS_READINGS:
            break
    return max(seen) if seen else None


def tokens_per_sample(step: JobStep) -> Optional[float]:
    tokens, samples = step.rl.get("tokens"), step.samples
    return tokens / samples if tokens and samples else None


@dataclass(frozen=True)
class Point:
    value: float              # the knob's value over the stretch
    length: Optional[float]   # the most tokens per sample in the stretch (None: the job reports no tokens)
    peak_bytes: float
    weight: float             # 0.5 per memory_fit_half_life_s of step time since the stretch


@dataclass(frozen=True)
class MemoryFit:
    knob: str
    base_bytes: float
    per_sample_bytes: float
    per_token_bytes: float        # per token per sample (a sample knob) or per token of the budget (a token knob)
    margin_bytes: float           # memory_margin_pct of the GPU + the fit's largest recent miss
    miss_bytes: float             # the fit's largest recent miss alone
    line_bytes: float             # memory_line_pct of the GPU, less what other processes hold on it
    total_bytes: float
    length_now: Optional[float]   # tokens per sample now (the trend's value), None without tokens
    length_per_s: float           # the length's trend, tokens per sample per second of step time
    points: tuple[Point, ...]
    model: str
    others_bytes: float = 0.0     # memory of the GPU another process holds (the line is lowered by it)
    length_spread: float = 0.0    # how far one step's tokens per sample ran above the lengths' own line, at most, over
                                  # the newest steps (a fraction: ``_spread_above``)

    @property
    def token_budget(self) -> bool:
        return is_token_budget(self.knob)

    def length_ahead(self, ahead_s: float) -> Optional[float]:
        """Tokens per sample ``ahead_s`` seconds of step time from now: the trend where it grows, never less
        than now (a shrinking length is waited for, not anticipated). Where the trend does not grow (flat, shrinking
        — or turning, before the lines show it), as far above now as one step's length has run above what was read
        for it lately (``length_spread``, 0 where the trend grows by more than that over ``memory_trend_short_s``):
        the step a move lands on is one step, not the mean of several. At ±3 %
        step-to-step lengths a batch sized at the mean of the newest three (94 % of the GPU) met a step 7 % longer at
        the curriculum's turn, the trend still read shrinking, and OOMed after the raise. Where the trend grows, the
        move is sized for where it grows to, and the margin covers the steps around it (drift up: no OOM in 20 runs;
        the spread on top cost 2–3 % of its throughput)."""
        if self.length_now is None:
            return None
        return self.length_now * (1.0 + self.length_spread) + max(0.0, self.length_per_s) * ahead_s

    def predict(self, value: float, length: Optional[float] = None) -> float:
        if self.token_budget:
            return self.base_bytes + self.per_token_bytes * value
        length = self.length_now if length is None else length
        return self.base_bytes + value * (self.per_sample_bytes + self.per_token_bytes * (length or 0.0))

    def largest_fitting(self, length: Optional[float] = None) -> float:
        """The largest value whose prediction plus the margin stays under the line (∞: memory does not grow)."""
        room = self.line_bytes - self.margin_bytes - self.base_bytes
        per_unit = self.predict(1.0, length) - self.base_bytes
        return math.floor(room / per_unit) if per_unit > 0 else math.inf

    def evidence(self, value: float, length: Optional[float] = None) -> dict[str, Any]:
        recent = sorted(self.points, key=lambda p: -p.weight)[:8]
        out = {"model": self.model, "knob": self.knob, "batch": value,
               "predicted_gib": round(self.predict(value, length) / GIB, 3),
               "margin_gib": round(self.margin_bytes / GIB, 3), "line_gib": round(self.line_bytes / GIB, 3),
               "others_gib": round(self.others_bytes / GIB, 3), "base_gib": round(self.base_bytes / GIB, 3),
               "per_sample_mib": round(self.per_sample_bytes / 2**20, 3),
               "per_token_kib": round(self.per_token_bytes / 2**10, 3), "stretches": len(self.points),
               "points_gib": {f"{p.value:g}" + (f"@{p.length:.0f}" if p.length else ""): round(p.peak_bytes / GIB, 3)
                              for p in recent}}
        if self.length_now is not None and not self.token_budget:
            out.update(tokens_per_sample_now=round(self.length_now, 1),
                       tokens_per_sample_at=round(self.length_now if length is None else length, 1),
                       length_trend_per_s=round(self.length_per_s, 4),
                       length_spread_pct=round(100.0 * self.length_spread, 2))
        return out


def _points(steps: Sequence[JobStep], changes: Sequence[StoredChange], knob: str, now_value: float,
            half_life_s: float) -> list[Point]:
    """One point per stretch of steps between two memory samples (the peak is reset at each sample), skipping a
    stretch the knob moved in (the step a change took effect at ran partly at the old value) and one that hit an
    OOM (its peak is what was allocated before the failure: less than the value needs, a lost step)."""
    at, applied_steps = knob_history(changes, knob, now_value)
    age_after: list[float] = []  # step time after each step, to the newest
    total = 0.0
    for s in reversed(steps):
        age_after.append(total)
        total += s.step_time_s
    age_after.reverse()
    out, stretch = [], []
    ooms_before = next((s.num_ooms for s in steps if s.num_ooms is not None), 0)
    oom_in_stretch = False
    for i, s in enumerate(steps):
        stretch.append(s)
        if s.num_ooms is not None:
            oom_in_stretch |= s.num_ooms > ooms_before
            ooms_before = s.num_ooms
        if s.mem_peak_bytes is None:
            continue
        values = {at(x.step) if ran_at(x, knob) is None else ran_at(x, knob) for x in stretch}
        lengths = [v for v in map(tokens_per_sample, stretch) if v is not None]
        # (a step that reports its value ran at it all through; the step a change took effect at may not have)
        moved = any(x.step in applied_steps and ran_at(x, knob) is None for x in stretch)
        stretch, oom = [], oom_in_stretch
        oom_in_stretch = False
        if moved or oom or len(values) != 1 or None in values:
            continue
        weight = 0.5 ** (age_after[i] / half_life_s) if half_life_s > 0 else 1.0
        out.append(Point(values.pop(), max(lengths) if lengths else None, float(s.mem_peak_bytes), weight))
    return out


def _solve(rows: list[list[float]], ys: list[float], ws: list[float]) -> Optional[list[float]]:
    """Weighted least squares (normal equations, Gaussian elimination); None when the terms cannot be told apart."""
    n = len(rows[0])
    a = [[sum(w * r[i] * r[j] for r, w in zip(rows, ws)) for j in range(n)] for i in range(n)]
    b = [sum(w * r[i] * y for r, y, w in zip(rows, ys, ws)) for i in range(n)]
    scale = [math.sqrt(a[i][i]) or 1.0 for i in range(n)]  # conditioning on the scaled system
    a = [[a[i][j] / (scale[i] * scale[j]) for j in range(n)] for i in range(n)]
    b = [b[i] / scale[i] for i in range(n)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[pivot][c]) < 1e-9:
            return None
        a[c], a[pivot], b[c], b[pivot] = a[pivot], a[c], b[pivot], b[c]
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
                b[r] -= f * b[c]
    return [b[i] / a[i][i] / scale[i] for i in range(n)]


def _nonnegative(sol: Optional[list[float]], rows: list[list[float]], ys: Sequence[float]) -> Optional[list[float]]:
    """``sol`` with negative terms that move the fit by rounding error only (under 0.1 % of the mean peak) set to
    0; None when a term is truly negative."""
    if sol is None:
        return None
    mean_y = sum(ys) / len(ys)
    out = []
    for j, c in enumerate(sol):
        if c < 0 and abs(c) * max(abs(r[j]) for r in rows) > 1e-3 * mean_y:
            return None
        out.append(max(0.0, c))
    return out


def _spread(values: Sequence[float], ws: Sequence[float]) -> float:
    """Weighted coefficient of variation."""
    mean = sum(v * w for v, w in zip(values, ws)) / sum(ws)
    var = sum(w * (v - mean) ** 2 for v, w in zip(values, ws)) / sum(ws)
    return math.sqrt(var) / mean if mean > 0 else 0.0


def _fit_terms(pts: list[Point], token_budget: bool, min_spread: float) -> tuple[float, float, float, str]:
    """(base, per_sample, per_token, model) — see the module docstring for which terms the evidence carries."""
    ws = [p.weight for p in pts]
    ys = [p.peak_bytes for p in pts]
    vs = [p.value for p in pts]
    several = _spread(vs, ws) > 1e-6
    if token_budget or any(p.length is None for p in pts):
        what = "per token of the budget" if token_budget else "per sample"
        sol = _solve([[1.0, v] for v in vs], ys, ws) if several else None
        if sol is not None and sol[1] >= 0:
            base, slope = sol if sol[0] >= 0 else (0.0, _through_origin(vs, ys, ws))
            model = f"base + {what} fitted on {len(pts)} stretches"
        elif sol is not None:
            # Several values, and the peak did not grow with them (a rounding error either side of flat, or a peak
            # set by another phase): memory is flat across the values seen. Reading it as "one value seen" put
            # all of the peak per sample (20 GiB at batch 1 predicted 80 GiB at batch 4 on the H200 pipeline).
            base, slope = max(ys), 0.0
            model = f"flat across the {len(set(vs))} values seen (the largest peak)"
        else:
            base, slope, model = 0.0, _through_origin(vs, ys, ws), f"one value seen: all memory {what} (an upper bound)"
        return (base, 0.0, slope, model) if token_budget else (base, slope, 0.0, model)
    ls = [p.length for p in pts]
    xs = [v * length for v, length in zip(vs, ls)]
    if _spread(ls, ws) * 100.0 >= min_spread:
        if several:
            # A term the data make negative is dropped (memory does not shrink with a larger value or length):
            # first the per-sample one (a KV cache is all per token), then the base.
            for terms in ((1, 1, 1), (1, 0, 1), (0, 1, 1)):
                rows = [[t for t, on in zip((1.0, v, x), terms) if on] for v, x in zip(vs, xs)]
                sol = _nonnegative(_solve(rows, ys, ws), rows, ys)
                if sol is not None:
                    full = iter(sol)
                    base, per_sample, per_token = (next(full) if on else 0.0 for on in terms)
                    return base, per_sample, per_token, (f"base + per sample + per token fitted on {len(pts)} "
                                                         f"stretches")
        v0 = sum(v * w for v, w in zip(vs, ws)) / sum(ws)
        sol = _solve([[1.0, x] for x in xs], ys, ws)
        if sol is not None and sol[1] >= 0:
            # One batch size: its fixed part (base + per-sample memory) cannot be split: all of it per sample.
            return 0.0, max(0.0, sol[0]) / v0, sol[1], (f"per sample + per token fitted on {len(pts)} stretches at "
                                                       f"one value (the base counted per sample: an upper bound)")
    # Lengths that barely moved: every byte that grows with the value is taken to grow with the length too.
    length_ref = sum(length * w for length, w in zip(ls, ws)) / sum(ws)
    base, per_sample, _, model = _fit_terms([Point(p.value, None, p.peak_bytes, p.weight) for p in pts], False,
                                            min_spread)
    return base, 0.0, per_sample / length_ref, f"{model}, all of it per token (lengths barely moved: an upper bound)"


def _through_origin(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> float:
    """The largest per-unit slope the points show with no base: an upper bound for a larger value."""
    return max(y / x for x, y in zip(xs, ys) if x > 0) if any(x > 0 for x in xs) else 0.0


def _lengths_back(steps: Sequence[JobStep], half_life_s: float, within_s: float) -> list[tuple[float, float, float]]:
    """(−age in step time, tokens per sample, weight) of the steps within ``within_s`` of the newest (those with
    tokens), weighted by age (``half_life_s``; 0: evenly), newest first."""
    pts, age = [], 0.0
    for s in reversed(steps):
        if age > within_s:
            break
        length = tokens_per_sample(s)
        if length is not None:
            pts.append((-age, length, 0.5 ** (age / half_life_s) if half_life_s > 0 else 1.0))
        age += s.step_time_s
    return pts


def _line_now(steps: Sequence[JobStep], half_life_s: float, within_s: float = math.inf) -> Optional[tuple[float, float]]:
    """(tokens per sample now, tokens per sample per second of step time): a line through the lengths of the steps
    within ``within_s`` of step time of the newest, weighted by age (``half_life_s``; 0: evenly); None without
    three lengths."""
    pts = _lengths_back(steps, half_life_s, within_s)
    sol = _solve([[1.0, t] for t, _, _ in pts], [length for _, length, _ in pts], [w for _, _, w in pts]) \
        if len(pts) >= 3 else None
    return None if sol is None else (max(0.0, sol[0]), sol[1])


def _spread_above(steps: Sequence[JobStep], within_s: float, per_s: float) -> float:
    """How far one step's tokens per sample ran above the length read for it at most (a fraction of that length):
    for each of the newest steps within ``within_s`` of step time (at least ``SPREAD_MIN_STEPS`` of them), its length
    over the mean of the ``NEWEST_STEPS`` steps before it — "now" as it was read the step before — carried on by the
    trend where it grows (``per_s``, tokens per sample per second of step time). 0 for lengths on a line or that
    only fall; a turn from falling to growing that the trend does not show yet reads as spread (the safe side)."""
    back = _lengths_back(steps, 0.0, within_s)
    need = SPREAD_MIN_STEPS + NEWEST_STEPS
    if len(back) < need:
        back = _lengths_back(steps, 0.0, math.inf)[:need]
    pts = list(reversed(back))  # oldest first: (−age, length, _)
    out = 0.0
    for i in range(NEWEST_STEPS, len(pts)):
        before = pts[i - NEWEST_STEPS:i]
        read = sum(length for _, length, _ in before) / NEWEST_STEPS
        t_read = sum(t for t, _, _ in before) / NEWEST_STEPS
        expected = read + max(0.0, per_s) * (pts[i][0] - t_read)
        if read > 0:
            out = max(out, (pts[i][1] - expected) / read)
    return out


def _length_trend(steps: Sequence[JobStep], half_life_s: float,
                  short_s: float = 0.0) -> tuple[Optional[float], float]:
    """(tokens per sample now, tokens per sample per second of step time). Now: the mean of the newest
    ``NEWEST_STEPS`` steps' lengths (a line through minutes of lengths reads "now" off by the curve's bend: 30 tokens
    high on a shrinking job whose steps shorten with it, and low at a turn from shrinking to growing — the
    curriculum's OOMs, a raise sized for 131 tokens per sample at 153), or the short line's value where that line
    grows and reads higher (the mean lags growth by a step or two). The trend: the steeper of two lines, one over
    ``half_life_s`` of step time (steady: noise averages out) and one through the newest ``short_s`` of step time
    alone, unweighted (a turn shows there first: a line weighted by age, even with a 10 s half-life, still read the
    curriculum's lengths as shrinking 50 steps after they turned)."""
    lengths = [x for x in map(tokens_per_sample, steps) if x is not None]
    if not lengths:
        return None, 0.0
    newest = sum(lengths[-NEWEST_STEPS:]) / len(lengths[-NEWEST_STEPS:])
    long_line = _line_now(steps, half_life_s)
    short_line = _line_now(steps, 0.0, short_s) if short_s > 0 else None
    if long_line is None:
        return lengths[-1], 0.0
    if short_line is None:
        return newest, long_line[1]
    now = max(newest, short_line[0]) if short_line[1] > 0 else newest
    return now, max(long_line[1], short_line[1])


def fit(steps: Sequence[JobStep], changes: Sequence[StoredChange], knob: str, now_value: float,
        ctl: ControllerSettings) -> Optional[MemoryFit]:
    """The job's memory as a function of ``knob`` (and its tokens per sample); None without peaks or a capacity."""
    totals = [s.mem_total_bytes for s in steps if s.mem_total_bytes]
    pts = [p for p in _points(steps, changes, knob, now_value, ctl.memory_fit_half_life_s) if p.value > 0]
    if not pts or not totals:
        return None
    token_budget = is_token_budget(knob)
    if not token_budget and any(p.length is not None for p in pts):
        pts = [p for p in pts if p.length is not None]  # stretches before the job reported tokens: another model
    total = float(min(totals))
    base, per_sample, per_token, model = _fit_terms(pts, token_budget, ctl.memory_min_length_spread_pct)
    length_now, per_s = _length_trend(steps, ctl.memory_fit_half_life_s, ctl.memory_trend_short_s) if pts[0].length is not None else (None, 0.0)
    spread = _spread_above(steps, ctl.memory_trend_short_s, per_s) \
        if length_now is not None and not token_budget else 0.0
    if length_now is not None and per_s * ctl.memory_trend_short_s > length_now * spread:
        spread = 0.0  # a growth the steps' spread cannot make: sized for the trend, the margin covers the steps
    others = others_bytes(steps) or 0.0
    line = total * ctl.memory_line_pct / 100.0 - others
    mfit = MemoryFit(knob, base, per_sample, per_token, 0.0, 0.0, line, total, length_now, per_s, tuple(pts), model,
                     others, spread)
    recent = [p for p in pts if p.weight >= RECENT_WEIGHT] or pts
    # Only a peak above the fit widens the margin: an over-prediction (an upper-bound model) is the safe side.
    miss = max(max(0.0, p.peak_bytes - mfit.predict(p.value, p.length)) for p in recent)
    margin = total * ctl.memory_margin_pct / 100.0 + miss
    return MemoryFit(knob, base, per_sample, per_token, margin, miss, line, total, length_now, per_s, tuple(pts),
                     model, others, spread)
