"""What a job's window shows beyond the rules: tokens/s, an RL trainer's prompts, completions, completion length
and reward, and the generation cadence that explains alternating step times (TRL's ``steps_per_generation``:
one generation batch every k-th optimizer step, the steps between train on slices of it)."""

from __future__ import annotations

import statistics
from typing import Any, Optional, Sequence

from trimtab.contract.learning import SIGNAL_NAMES
from trimtab.grading.window import RL_COUNTS, RL_MEANS, JobStep


def rl_facts(win: Sequence[JobStep]) -> dict[str, Optional[float]]:
    """Over the window: ``tokens_per_s``, ``prompts_per_step`` and ``completions_per_step`` (over the steps that
    report them), and the means of the logged ``completion_mean_tokens`` and ``reward_mean``."""
    out: dict[str, Optional[float]] = {}
    for name in RL_COUNTS:
        known = [s for s in win if s.rl.get(name) is not None]
        if name == "tokens":
            seconds = sum(s.step_time_s for s in known)
            out["tokens_per_s"] = sum(s.rl[name] for s in known) / seconds if known and seconds > 0 else None
        else:
            out[f"{name}_per_step"] = statistics.fmean(s.rl[name] for s in known) if known else None
    for name in RL_MEANS:
        known = [s.rl[name] for s in win if s.rl.get(name) is not None]
        out[name] = statistics.fmean(known) if known else None
    return out


def learning_facts(win: Sequence[JobStep]) -> dict[str, Optional[float]]:
    """Each learning signal's mean over the window's steps that report it (absent: none does)."""
    out: dict[str, Optional[float]] = {}
    for name in SIGNAL_NAMES:
        known = [v for v in (s.reported.get(f"learning_{name}") for s in win) if v is not None]
        if known:
            out[name] = statistics.fmean(known)
    return out


def generation_cadence(win: Sequence[JobStep]) -> Optional[dict[str, Any]]:
    """When only some of the window's steps generate (the others report generation 0 s): how many, and the mean
    step time with and without generation. None when every step generates, or none reports generation."""
    timed = [s for s in win if s.phases_s.get("generation") is not None]
    generating = [s for s in timed if s.phases_s["generation"] > 0]
    idle = [s for s in timed if s.phases_s["generation"] == 0]
    if not generating or not idle:
        return None
    return {"generating_steps": len(generating), "steps": len(timed),
            "step_with_generation_s": statistics.fmean(s.step_time_s for s in generating),
            "step_without_generation_s": statistics.fmean(s.step_time_s for s in idle)}


def cadence_line(cadence: dict[str, Any]) -> str:
    return (f"generation ran in {cadence['generating_steps']:g} of {cadence['steps']:g} steps: one generation batch "
            f"feeds several optimizer steps (TRL: steps_per_generation × num_iterations), so step times alternate — "
            f"{cadence['step_with_generation_s']:.2f} s with generation, {cadence['step_without_generation_s']:.2f} s "
            f"without")
