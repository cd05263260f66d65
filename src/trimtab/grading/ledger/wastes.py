"""The largest wastes in a job's ledger, each with the action that addresses it (the balancing playbook:
generation batching and prefetch when critic or reward wait for the actor; the reward model apart when it holds
the others up; a lower sync frequency when communication dominates), for ``trimtab check``.

A waste is idle GPU time of one cause (and, for a wait, one waiting role and the role it waited for), added up over
the job's GPUs. The actions are data: the first row matching (cause, waiting role, role waited for) applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from trimtab.grading.ledger.model import COMMUNICATION, HOST, IDLE, NO_JOB, UNKNOWN, WAITING

ANY = "*"
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class WasteAction:
    cause: str
    waiter: str        # the idle GPU's role (ANY: whichever)
    waiting_for: str   # the role waited for (ANY: whichever; "" for causes other than waiting)
    action: str
    knobs: tuple[str, ...] = ()  # the knobs the action moves (a rebalancer decision on one of them addresses it)


# (cause, waiting role, role waited for) → what to do; the first match wins.
ACTIONS: tuple[WasteAction, ...] = (
    WasteAction(WAITING, ANY, "actor", "generation waits hold the scorers up: raise the generation batch size "
                                       "(batch_size) and prefetch (prefetch) so critic/reward always have a "
                                       "generated batch waiting", ("batch_size", "prefetch")),
    WasteAction(WAITING, ANY, "reward", "the reward model holds the others up: put it apart on its own GPU, score in "
                                        "fp16/bf16 with gradient checkpointing, truncate its inputs"),
    WasteAction(WAITING, ANY, "critic", "the critic holds the others up: raise prefetch (prefetch) so its scoring "
                                        "overlaps the next generation", ("prefetch",)),
    WasteAction(WAITING, ANY, ANY, "a role waits for another: raise prefetch (prefetch) to overlap them, or move "
                                   "the slower role to more GPUs (device_map)", ("prefetch",)),
    WasteAction(COMMUNICATION, ANY, ANY, "communication dominates: sync less often (sync_every up) and "
                                         "check NCCL_ALGO", ("sync_every",)),
    WasteAction(HOST, ANY, ANY, "host-side work of the role itself: overlap it (data loading, tokenization, "
                                "logging) with GPU work, more dataloader workers"),
    WasteAction(NO_JOB, ANY, ANY, "no step of the job on the GPU: give the GPU back, or place a role on it "
                                  "(device_map)"),
    WasteAction(UNKNOWN, ANY, ANY, "the GPU's process sends no step reports: run the trainer hook in it"),
)


@dataclass(frozen=True)
class Waste:
    cause: str
    role: str          # the idle GPU's role ("" for no_job)
    waiting_for: str
    gpus: tuple[str, ...]
    gpu_s: float
    action: str

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / SECONDS_PER_HOUR

    def what(self) -> str:
        if self.cause == WAITING:
            return f"{self.role} waiting for {self.waiting_for or 'unknown'}"
        if self.cause == NO_JOB:
            return "no job on the GPU"
        return f"{self.role}: {self.cause}" if self.role else self.cause

    def to_dict(self) -> dict:
        return {"cause": self.cause, "role": self.role, "waiting_for": self.waiting_for or None,
                "gpus": list(self.gpus), "gpu_s": self.gpu_s, "gpu_hours": self.gpu_hours, "what": self.what(),
                "action": self.action}


def row_for(cause: str, role: str, waiting_for: str) -> Optional[WasteAction]:
    """The first row of :data:`ACTIONS` matching the waste (None: none)."""
    for a in ACTIONS:
        if a.cause == cause and a.waiter in (ANY, role) and a.waiting_for in (ANY, waiting_for):
            return a
    return None


def action_for(cause: str, role: str, waiting_for: str) -> Optional[str]:
    row = row_for(cause, role, waiting_for)
    return row.action if row else None


def addressed_by(wastes: Iterable["Waste"], knob: str) -> list["Waste"]:
    """The wastes whose action moves ``knob``, largest first."""
    rows = ((w, row_for(w.cause, w.role, w.waiting_for)) for w in wastes)
    return sorted((w for w, row in rows if row is not None and knob in row.knobs), key=lambda w: -w.gpu_s)


def largest_wastes(totals: Iterable[tuple[str, str, str, str, str, float]], n: Optional[int] = 3) -> list[Waste]:
    """The ``n`` largest wastes from ledger totals ((gpu label, kind, role, name, waiting_for, gpu_s) rows)."""
    summed: dict[tuple[str, str, str], tuple[set, float]] = {}
    for gpu, kind, role, name, waiting_for, gpu_s in totals:
        if kind != IDLE or gpu_s <= 0:
            continue
        gpus, total = summed.get((name, role, waiting_for), (set(), 0.0))
        summed[(name, role, waiting_for)] = (gpus | {gpu}, total + gpu_s)
    wastes = [Waste(cause, role, waiting_for, tuple(sorted(gpus)), total, action_for(cause, role, waiting_for) or "")
              for (cause, role, waiting_for), (gpus, total) in summed.items()]
    return sorted(wastes, key=lambda w: (-w.gpu_s, w.cause, w.role, w.waiting_for))[:n]  # n None: all
