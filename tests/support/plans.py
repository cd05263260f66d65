"""Builders for the pure controller's tests (``plan(JobState, rules)`` on a state built by hand, no store): steps,
jobs, changes, decisions and GPU aggregates, and the checks ``acts``/``nothing`` on a plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from trimtab.control.controller import JobState, Plan
from trimtab.grading.rules import load_rules
from trimtab.grading.window import JobStep
from trimtab.store.changes import StoredChange
from trimtab.store.decisions import StoredDecision
from trimtab.store.jobs import StoredJob
from trimtab.store.queries import GpuAggregate

T0 = 1_700_000_000_000
NOW = T0 + 3_600_000
SHIPPED_RULES = load_rules()
# The jobs built here model throughput only and report no learning signal: their prefetch and sync_every are
# declared throughput-only, as bench/workloads.py declares its simulated jobs' (the shipped rules would make a change
# to them advice: tests/control/test_goodput.py tests that, on SHIPPED_RULES).
THROUGHPUT_ONLY = {"learning": {"throughput_only": ["prefetch", "sync_every"]}}
RULES = SHIPPED_RULES.with_overrides(THROUGHPUT_ONLY)
GIB = 2**30
PCIE_PEAK = 63e9


# -- builders -------------------------------------------------------------------------------------------------------

def steps(first: int, n: int, step_time: float = 45.0, gen: Optional[float] = 44.0, ev: Optional[float] = 0.5,
          comm: Optional[float] = None, samples: Optional[float] = 64, frag: Optional[float] = None,
          ooms: Optional[int] = None, latency_us: Optional[float] = None,
          retries: Optional[int] = None) -> list[JobStep]:
    """``n`` consecutive steps from ``first``; phases in seconds (45 s at batch 1, 44 s of it generating). By default
    no weight sync: the 1 s outside generation (evaluation and the update) is what a prefetch raise could hide, +2.2 %
    at most, above the 2 % dead band (a sync would pause generation and is not hidden: overlap_bound.py)."""
    out = []
    for s in range(first, first + n):
        end = T0 + int((s + 1) * step_time * 1000)
        rest = None if gen is None else max(0.0, step_time - gen - (ev or 0) - (comm or 0))
        out.append(JobStep(step=s, ranks=1, step_time_s=step_time, samples=samples,
                           phases_s={"generation": gen, "evaluation": ev, "communication": comm, "update": rest,
                                     "other": None},
                           fragmentation=frag, num_ooms=ooms, collective_latency_us=latency_us,
                           start_ms=end - int(step_time * 1000), end_ms=end,
                           num_alloc_retries=None if retries is None else retries + s - first))
    return out


def knobs(batch=1, prefetch=0, sync=1, batch_max=64, sync_max=8):
    return {"batch_size": {"value": batch, "min": 1, "max": batch_max},
            "prefetch": {"value": prefetch, "min": 0, "max": 8},
            "sync_every": {"value": sync, "min": 1, "max": sync_max}}


def job(mode="auto", device_map=None, **kw) -> StoredJob:
    return StoredJob(id=1, name="grpo", ranks=1, device_map=device_map or {}, hostnames=["node-a"],
                     knobs=knobs(**kw), mode=mode, owner_token_id=None, created_ms=T0, updated_ms=T0)


def change(id=3, knob="batch_size", value=4, previous=1, status="applied", applied_step: Optional[int] = 10,
           source="rebalancer") -> StoredChange:
    return StoredChange(id=id, job_id=1, knob=knob, value=value, previous_value=previous, reason="r", source=source,
                        status=status, created_ms=NOW - 120_000,
                        applied_step=applied_step if status == "applied" else None,
                        applied_ms=NOW - 100_000 if status == "applied" else None)


def decision(id=7, outcome="pending", change_id=3, knob="batch_size", old=1, new=4, ts_ms=NOW - 120_000,
             before=64 / 45, rule="generation_bound", evidence=None, applied_step=None) -> StoredDecision:
    return StoredDecision(id=id, job="grpo", ts_ms=ts_ms, rule=rule, evidence=evidence or {"reading": {}},
                          change_id=change_id, knob=knob, old_value=old, new_value=new, applied_step=applied_step,
                          throughput_before_samples_per_s=before, throughput_after_samples_per_s=None,
                          outcome=outcome, advice=None)


def gpu(i: int, mem_pct: float = 50.0, pcie_pct: float = 10.0, sm: float = 60.0, n: int = 10) -> GpuAggregate:
    total = 141 * GIB
    mean = {"mem_used_bytes": mem_pct / 100 * total, "mem_reserved_bytes": 0.0, "mem_total_bytes": total,
            "pcie_tx_bytes_per_s": pcie_pct / 100 * PCIE_PEAK, "pcie_rx_bytes_per_s": 1e6,
            "sm_active_pct": sm, "util_pct": 99.0}
    return GpuAggregate(hostname="node-a", simulated=False, gpu_uuid=f"GPU-{i:04d}", gpu_index=i,
                        gpu_name="NVIDIA H200", pcie_peak_bytes_per_s=PCIE_PEAK, nvlink_link_count=18,
                        n_samples=n, mean=mean, max=dict(mean))


@dataclass
class Fetch:
    gpus: list = field(default_factory=list)
    calls: list = field(default_factory=list)

    def __call__(self, start_ms: int, end_ms: int):
        self.calls.append((start_ms, end_ms))
        return list(self.gpus)


def state(job_steps, the_job=None, changes=(), decisions=(), gpus=None, has_gpus=None, baseline=None,
          now=NOW) -> JobState:
    the_job = the_job or job()
    fetch = gpus if isinstance(gpus, Fetch) else Fetch(list(gpus or []))
    return JobState(job=the_job, steps=list(job_steps), changes=list(changes), decisions=list(decisions),
                    gpus=fetch, probe_baseline_us=baseline, now_ms=now,
                    has_gpus=bool(the_job.device_map) if has_gpus is None else has_gpus)


def gpu_job(mode="auto", **kw) -> StoredJob:
    return job(mode=mode, device_map={"actor": [0], "reward": [1]}, **kw)


def acts(p: Plan, rule: str, knob: str, old: float, new: float) -> None:
    assert p.change is not None, p.note
    assert (p.change.rule, p.change.knob, p.change.old_value, p.change.new_value) == (rule, knob, old, new), p.note
    assert p.advised is None and p.advice_rule is None and p.close is None


def nothing(p: Plan) -> None:
    assert p.change is None and p.advised is None and p.advice_rule is None and p.close is None, p.note
