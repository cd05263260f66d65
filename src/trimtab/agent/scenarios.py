"""What the simulated node shows, as data: per scenario, a profile of ranges for each GPU role.

Roles follow a typical RL post-training device map: GPU 0 and 1 hold the actor and the reference model, GPU 2 the
critic, GPU 3 the reward model; extra GPUs hold more actor shards. Each range is (low, high); the simulated node
keeps every reading inside its range (see ``trimtab.agent.simulated``). The processes on each GPU and the phases of
the step (``STEP``) say which process does a GPU's work when: its per-process activity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, Optional

Range = tuple[float, float]


@dataclass(frozen=True)
class RoleProfile:
    """Ranges for one GPU role. Fractions are of the GPU's own capacity (memory total, link peak)."""

    util_pct: Range = (62.0, 75.0)  # NVML kernel-busy utilization
    sm_ratio: Range = (0.84, 0.93)  # GPM SM activity as a share of util: a bit lower than kernel-busy
    tensor_ratio: Range = (0.45, 0.70)  # tensor activity as a share of SM activity
    occupancy_ratio: Range = (0.35, 0.60)  # SM occupancy as a share of SM activity
    dram_ratio: Range = (0.30, 0.60)  # DRAM bandwidth use as a share of util
    mem_frac: Range = (0.55, 0.70)  # used / total; 1.0 = full (used == total − reserved)
    pcie_frac: Range = (0.05, 0.25)  # TX and RX, each of the per-direction link peak
    nvlink_frac: Range = (0.10, 0.30)  # TX and RX, each of the per-direction NVLink peak


@dataclass(frozen=True)
class Segment:
    """One phase of a role in a pipeline step: [start_s, end_s) of the step's period, the step report's phase name,
    and the GPU-busy seconds in it (the CUDA-event time a hook would report; 0 for a wait or host-side work)."""

    phase: str
    start_s: float
    end_s: float
    gpu_s: float = 0.0

    @property
    def util_pct(self) -> float:
        """NVML's utilization over the segment: the share of its time a kernel ran."""
        return 100.0 * self.gpu_s / (self.end_s - self.start_s)


@dataclass(frozen=True)
class PhaseSchedule:
    """A pipeline's step, repeated every ``period_s`` seconds from the epoch (steps end at multiples of it): each
    role's phases back to back over the period. A GPU's utilization follows its role's segments."""

    period_s: float
    roles: Mapping[str, tuple[Segment, ...]]

    def segment_at(self, role: str, ts_ms: int) -> Optional[Segment]:
        offset_s = (ts_ms / 1000.0) % self.period_s
        return next((s for s in self.roles.get(role, ()) if s.start_s <= offset_s < s.end_s), None)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    roles: Mapping[str, RoleProfile]  # "actor", "critic", "reward"; a role not named gets NORMAL
    schedule: Optional[PhaseSchedule] = None  # utilization follows it (the other readings stay in the profiles)


NORMAL = RoleProfile()
ROLES = ("actor", "critic", "reward")
# Device maps by GPU count; from 4 GPUs on, the typical map, extra GPUs being actor shards.
_SMALL_MAPS: dict[int, tuple[str, ...]] = {1: ("actor",), 2: ("actor", "reward"), 3: ("actor", "critic", "reward")}
_TYPICAL_MAP = ("actor", "actor", "critic", "reward")


def device_roles(n_gpus: int) -> tuple[str, ...]:
    """The role of each GPU index; for 4+ GPUs: 0,1 actor+ref; 2 critic; 3 reward; the rest actor."""
    if n_gpus < 4:
        return _SMALL_MAPS[n_gpus]
    return _TYPICAL_MAP + ("actor",) * (n_gpus - 4)


# The worker processes on a GPU of each role: an actor GPU also holds the reference model's process.
GPU_PROCESSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"actor": ("actor", "ref"), "critic": ("critic",), "reward": ("reward",)})


@dataclass(frozen=True)
class Phase:
    """One phase of the simulated RL step: ``ticks`` long; ``share``: per process role, its share of the busy time
    of each GPU holding it. A GPU's processes share all of its busy time in every phase (its util is their work);
    where a phase names none of a GPU's processes they share it evenly (the critic's and the reward model's GPUs
    hold one process each, which does all of their work)."""

    name: str
    ticks: int
    share: Mapping[str, float]


# One step, repeated: the actor generates, the reference model scores the rollouts (log-probs), the actor trains.
STEP: tuple[Phase, ...] = (
    Phase("generate", 3, MappingProxyType({"actor": 1.0, "ref": 0.0})),
    Phase("reference", 1, MappingProxyType({"actor": 0.0, "ref": 1.0})),
    Phase("train", 2, MappingProxyType({"actor": 0.85, "ref": 0.15})),
)
STEP_TICKS = sum(p.ticks for p in STEP)


def phase_at(tick: int) -> Phase:
    """The phase of the step that tick ``tick`` falls in (tick 0 starts a step)."""
    t = tick % STEP_TICKS
    for phase in STEP:
        if t < phase.ticks:
            return phase
        t -= phase.ticks
    raise AssertionError("unreachable: t < STEP_TICKS")


def process_shares(role: str, phase: Phase) -> dict[str, float]:
    """Per process on a GPU of ``role``, its share of that GPU's busy time in ``phase`` (they add up to 1)."""
    names = GPU_PROCESSES[role]
    named = {p: phase.share[p] for p in names if p in phase.share}
    if not named:
        return {p: 1.0 / len(names) for p in names}
    total = sum(named.values())
    if total <= 0:
        raise ValueError(f"phase {phase.name!r} gives no share of a {role} GPU's work to any of its processes")
    return {p: named.get(p, 0.0) / total for p in names}


# A synchronous PPO-like step of 10 s on the typical map (actor GPUs 0-1, critic 2, reward 3): every role starts
# with half a second of host-side bookkeeping; the actor generates while the critic updates on the batch before,
# critic and reward score the new batch (the reward model longer), the actor updates and syncs its weights. Some
# other role works whenever one waits. The truth test of the GPU-time ledger (tests/api/test_gpu_time_truth.py)
# computes its true GPU-seconds from this schedule.
PIPELINE_SCHEDULE = PhaseSchedule(10.0, MappingProxyType({
    "actor": (Segment("other", 0.0, 0.5), Segment("generation", 0.5, 5.0, 4.0), Segment("wait", 5.0, 8.0),
              Segment("update", 8.0, 9.5, 1.5), Segment("communication", 9.5, 10.0, 0.5)),
    "critic": (Segment("other", 0.0, 0.5), Segment("update", 0.5, 1.5, 1.0), Segment("wait", 1.5, 5.0),
               Segment("evaluation", 5.0, 7.0, 2.0), Segment("wait", 7.0, 10.0)),
    "reward": (Segment("other", 0.0, 0.5), Segment("wait", 0.5, 5.0), Segment("evaluation", 5.0, 8.0, 3.0),
               Segment("wait", 8.0, 10.0)),
}))

_SCENARIOS = (
    Scenario("balanced", "In trim: every GPU 62–75 % busy, memory 55–70 %, PCIe under 30 % of peak.",
             {"actor": replace(NORMAL, mem_frac=(0.62, 0.70), nvlink_frac=(0.20, 0.35)),
              "critic": replace(NORMAL, mem_frac=(0.55, 0.63)),
              "reward": replace(NORMAL, mem_frac=(0.55, 0.62))}),
    Scenario("actor-hot", "Actor generation slow (GPU 0/1 90–99 %), critic idling under 30 %.",
             {"actor": replace(NORMAL, util_pct=(90.0, 99.0), mem_frac=(0.72, 0.85), nvlink_frac=(0.30, 0.50)),
              "critic": replace(NORMAL, util_pct=(12.0, 28.0), mem_frac=(0.40, 0.50), pcie_frac=(0.02, 0.08)),
              "reward": replace(NORMAL, util_pct=(45.0, 60.0))}),
    Scenario("reward-memory", "The reward model fills its GPU's memory and runs hot.",
             {"reward": replace(NORMAL, util_pct=(85.0, 96.0), mem_frac=(1.0, 1.0), dram_ratio=(0.55, 0.80))}),
    Scenario("pcie-saturated", "The reward GPU's PCIe link above 90 % of peak both ways, sustained.",
             {"reward": replace(NORMAL, pcie_frac=(0.92, 0.985))}),
    Scenario("pipeline", "A synchronous RL pipeline: each GPU's utilization follows its role's phases of a 10 s "
             "step (actor generates and updates, critic and reward score, each waits for the others).",
             {}, PIPELINE_SCHEDULE),
)

SCENARIOS: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in _SCENARIOS})


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``ValueError`` naming the valid ones otherwise."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}") from None
