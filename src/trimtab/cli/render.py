"""Human-readable rendering of balance reports (a per-GPU table and one line per verdict), of job sections, and of
the overall verdict that ends `trimtab check`'s output (each section has its own; the last line is the one the exit
code gives, so a balanced job printed last never reads as the verdict of a node out of balance above it)."""

from __future__ import annotations

from typing import Optional, Sequence

from trimtab.contract.statuses import ACT, NO_DATA, OK, UNSUPPORTED, WATCH
from trimtab.grading.balance import BalanceReport
from trimtab.grading.step_facts import cadence_line
from trimtab.store.plan_status import describe

MARK = {OK: "ok   ", WATCH: "WATCH", ACT: "ACT  ", NO_DATA: "-    ", UNSUPPORTED: "n/a  "}


def _num(v: Optional[float], fmt: str = "{:.1f}", missing: str = "n/a") -> str:
    return missing if v is None else fmt.format(v)


def _gbps(v: Optional[float], missing: str = "n/a") -> str:
    return missing if v is None else f"{v / 1e9:.2f}"


def render_report(r: BalanceReport) -> str:
    head = f"node {r.hostname}" + ("  [SIMULATED node: readings are synthetic]" if r.simulated else "")
    lines = [head, f"window: last {r.window_s:g} s, means per GPU", ""]
    cols = ["GPU", "util %", "SM act %", "mem %", "PCIe TX GB/s", "PCIe RX GB/s", "PCIe % peak", "NVLink TX GB/s", "NVLink RX GB/s", "samples"]
    rows = []
    for g in r.gpus:
        nv_missing = "n/a" if g.nvlink_supported else "unsupported"
        rows.append([f"{g.index}", _num(g.util_pct), _num(g.sm_active_pct), _num(g.mem_used_pct),
                     _gbps(g.pcie_tx_bytes_per_s), _gbps(g.pcie_rx_bytes_per_s), _num(g.pcie_pct_of_peak),
                     _gbps(g.nvlink_tx_bytes_per_s, nv_missing), _gbps(g.nvlink_rx_bytes_per_s, nv_missing), f"{g.n_samples}"])
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines.append("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    lines.extend("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows)
    lines.append("")
    for v in r.verdicts:
        lines.append(f"  {MARK[v.status]} {v.check:<20} {v.message}")
        if v.advice and v.status in (WATCH, ACT):
            lines.append(f"        → {v.advice}")
    verdict = {OK: "BALANCED", WATCH: "BALANCED (watch the rows marked WATCH)", ACT: "OUT OF BALANCE"}[r.status]
    if r.stale and r.newest_sample_age_s is None:  # heard from, nothing stored (every batch refused)
        verdict = "STALE (no sample stored): no current verdict"
    elif r.stale:  # the rows above are from samples too old to be a current verdict
        verdict = (f"STALE (newest sample {r.newest_sample_age_s:.1f} s old, more than {r.stale_after_s:.1f} s): "
                   f"no current verdict")
    if r.clock_note:
        lines.extend(["", f"clock: {r.clock_note}"])
    lines.append("")
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)


def _age(ms: Optional[int], now_ms: int) -> str:
    if ms is None:
        return "never"
    s = max(0.0, (now_ms - ms) / 1000)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _knob(spec: dict) -> str:
    return f"{_value(spec.get('value'))} ({_value(spec.get('min'))}–{_value(spec.get('max'))})"


def _value(v) -> str:
    return "?" if v is None else f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _rl_line(rl: dict) -> str:
    """Tokens/s and what an RL trainer logged (samples there are completions), or "" when none of it is known."""
    parts = [f"{_num(rl.get('tokens_per_s'), '{:.1f}')} tokens/s"] if rl.get("tokens_per_s") is not None else []
    if rl.get("completions_per_step") is not None:
        prompts = rl.get("prompts_per_step")
        parts.append(f"{rl['completions_per_step']:g} completions" + (f" of {prompts:g} prompts" if prompts else "")
                     + " per step (the samples)")
    if rl.get("completion_mean_tokens") is not None:
        parts.append(f"completions {rl['completion_mean_tokens']:.1f} tokens long")
    if rl.get("reward_mean") is not None:
        parts.append(f"reward {rl['reward_mean']:.3g}")
    return "; ".join(parts)


def learning_line(learning: dict) -> str:
    """``learning (window means): reward 0.412, clip_fraction 0.031, kl 0.0021``: the signals the job reports."""
    return "learning (window means): " + ", ".join(f"{name} {value:.3g}" for name, value in learning.items())


def roles_line(gpus_by_role) -> str:
    """``actor+ref+rollout vm GPU 0 · critic vm GPU 1``: colocated roles (the same GPUs on a node) joined."""
    together: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for role, nodes in sorted(gpus_by_role.items()):
        for node, gpus in sorted(nodes.items()):
            together.setdefault((node, tuple(gpus)), []).append(role)
    return " · ".join(f"{'+'.join(roles)} {node} GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}"
                      for (node, gpus), roles in together.items())


def planner_lines(p: dict, now_ms: int) -> list[str]:
    """What the rebalancer last said about the job: the error while its plans fail; else its last plan's note and,
    when it decided nothing, the gate that held it, the window, what it misses and when it expects to decide."""
    if not p:
        return []
    if p.get("failing"):
        retry = p.get("retry_at_ms")
        again = f", planned again in {max(0.0, (retry - now_ms) / 1000):.0f} s" if retry is not None else ""
        return [f"planner: fails on this job ({p.get('failures')} in a row, the first "
                f"{_age(p.get('failing_since_ms'), now_ms)}{again}): {describe(p.get('last_error') or {})}"]
    lines = [f"planner ({_age(p.get('planned_ms'), now_ms)}, at step {_value(p.get('step'))}): {p.get('note')}"]
    gate = p.get("gate")
    if gate:
        bits = [f"held: {gate['name'].replace('_', ' ')}" + (f" ({gate['rule']})" if gate.get("rule") else "")]
        w = gate.get("window")
        if w and w.get("steps"):
            bits.append(f"window steps {w['steps'][0]}–{w['steps'][1]}, "
                        f"{_num(w.get('samples_per_s'), '{:.2f}')} samples/s")
        if gate.get("missing"):
            bits.append(f"missing: {gate['missing']}")
        step = gate.get("expects_step")
        bits.append(f"expects to decide at step {step}" if step is not None else "not before the job moves")
        lines.append("  " + "; ".join(bits))
    return lines


def verdicts_line(verdicts: dict) -> str:
    """Both verdicts of a learning knob's decision: "throughput +12.3 % (99 % sure): kept · learning broke: …"."""
    return f"throughput {verdicts.get('throughput', '?')} · learning {verdicts.get('learning', '?')}"


def render_job(j) -> str:
    """One job's section (a :class:`trimtab.grading.job_report.JobSummary`): knobs, window, the three job rows
    and the recent decisions."""
    head = f"job {j.name}  mode {j.mode}  ranks {j.ranks}" + (f"  on {', '.join(j.hostnames)}" if j.hostnames else "")
    if j.simulated:
        head += "  [SIMULATED node]"
    planner = getattr(j, "planner", None) or {}
    if planner.get("failing"):
        err = planner.get("last_error") or {}
        head += f"  — THE PLANNER FAILS ON THIS JOB: {err.get('type')}: {err.get('message')}"
    lines = [head]
    if getattr(j, "gpus_by_role", None):
        lines.append(f"roles: {roles_line(j.gpus_by_role)}")
    knobs = ", ".join(f"{k} {_knob(v)}" for k, v in sorted(j.knobs.items())) or "none declared"
    lines.append(f"knobs: {knobs}" + (f" — {j.advise_only_reason}" if j.advise_only_reason else ""))
    if j.learning_advice:
        lines.append(f"learning: {j.learning_advice}")
    if j.window_steps:
        first, last = j.window_steps
        span = f"step {first}" if first == last else f"steps {first}–{last}"
        lines.append(f"window: {span} ({j.n_steps} steps, {j.window_s:.1f} s), "
                     f"{_num(j.samples_per_s, '{:.2f}')} samples/s, step {_num(j.step_time_s, '{:.2f}')} s; "
                     f"last report {_age(j.last_report_ms, j.generated_at_ms)}")
        rl = _rl_line(j.rl)
        if rl:
            lines.append(rl)
        if j.learning:
            lines.append(learning_line(j.learning))
        if j.generation_cadence:
            lines.append(cadence_line(j.generation_cadence))
        wall = j.wall_phase_shares
        if j.time_base == "gpu" and any(v is not None for v in wall.values()):
            lines.append("phase shares on GPU time (CUDA events); on wall time: " + ", ".join(
                f"{p} {100 * v:.1f} %" for p, v in wall.items() if v is not None))
    else:
        lines.append(f"window: no complete step yet; last report {_age(j.last_report_ms, j.generated_at_ms)}")
    lines.append("")
    for v in j.verdicts:
        lines.append(f"  {MARK[v.status]} {v.check:<20} {v.message}")
        if v.advice and v.status in (WATCH, ACT):
            lines.append(f"        → {v.advice}")
    lines.extend(planner_lines(planner, j.generated_at_ms))
    lines.append("")
    if j.decisions:
        lines.append(f"recent decisions (newest first, last {len(j.decisions)}):")
        for d in j.decisions:
            tp = ""
            if d.throughput_before_samples_per_s is not None:
                tp = f"  {d.throughput_before_samples_per_s:.2f}"
                after = d.throughput_after_samples_per_s
                tp += f" → {after:.2f} samples/s" if after is not None else " samples/s before"
            step = f" at step {d.applied_step}" if d.applied_step is not None else ""
            lines.append(f"  {_age(d.ts_ms, j.generated_at_ms):>11}  {d.rule:<20} {d.change:<24} "
                         f"{d.outcome or '?'}{step}{tp}" + (f" — {d.note}" if d.note else "")
                         + (f"\n{'':13}addresses {d.waste}" if d.waste else "")
                         + (f"\n{'':13}{verdicts_line(d.verdicts)}" if d.verdicts else ""))
    else:
        lines.append("recent decisions: none")
    verdict = {OK: "BALANCED", WATCH: "BALANCED (watch the rows marked WATCH)", ACT: "OUT OF BALANCE"}[j.status]
    lines.append("")
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)


def render_overall(reports: Sequence[BalanceReport], jobs: Sequence, exit_code: int) -> str:
    """The last line of `trimtab check`: the overall verdict and the exit code it gives, naming every section
    that decided it (a stale node, else each node or job out of balance, else those to watch)."""
    stale = [f"node {r.hostname}" for r in reports if r.stale]
    sections = [(f"node {r.hostname}", r.status) for r in reports if not r.stale] + [(f"job {j.name}", j.status)
                                                                                   for j in jobs]
    act = [name for name, status in sections if status == ACT]
    watch = [name for name, status in sections if status == WATCH]
    if stale:
        word = f"STALE ({', '.join(stale)}): no current verdict" + (f"; out of balance: {', '.join(act)}" if act
                                                                     else "")
    elif act:
        word = f"OUT OF BALANCE ({', '.join(act)})"
    elif watch:
        word = f"BALANCED (watch {', '.join(watch)})"
    else:
        word = "BALANCED"
    return f"overall: {word}; exit {exit_code}"
