"""Where a job's roles run: each role (actor, rollout, ref, critic, reward, …) with its node, local GPU indices and
worker processes, as a framework adapter finds them (verl: its worker groups' Ray actors) or as a user declares them
(``--device-map``, which overrides what was found). Sent when the job registers; ``GET /v1/jobs/{name}`` and
``trimtab check`` show it. Colocated roles (verl's ActorRolloutRef workers) are one placement each, on the same GPUs;
a role on several nodes is one placement per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# found: from the framework's own workers; nvml: their pids matched to NVML's process list on the node (the daemon
# does it where the job could not tell the GPUs); declared: typed by the user
SOURCES = ("found", "nvml", "declared")
MAX_PLACEMENTS = 1024  # per job
MAX_GPUS_PER_NODE = 64  # local GPU indices of one role on one node
MAX_PIDS = 512  # worker processes of one role on one node
MAX_NODE_NAME = 253  # a hostname


@dataclass(frozen=True)
class RolePlacement:
    """One role of a job on one node: which local GPU indices (NVML's, as ``--device-map`` takes them) and which
    worker processes (their pids, as NVML's process list on that node shows them) hold it."""

    role: str
    node: str
    gpus: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()
    source: str = "found"

    def to_wire(self) -> dict[str, Any]:
        return {"role": self.role, "node": self.node, "gpus": list(self.gpus), "pids": list(self.pids),
                "source": self.source}

    @classmethod
    def from_wire(cls, item: Mapping[str, Any]) -> "RolePlacement":
        return cls(str(item["role"]), str(item["node"]), tuple(int(g) for g in item.get("gpus") or ()),
                   tuple(int(p) for p in item.get("pids") or ()), str(item.get("source") or "found"))


def merge(placements: Iterable[RolePlacement]) -> list[RolePlacement]:
    """One placement per (role, node, source): the GPUs and pids of several workers of one role on one node
    folded together, sorted; placements in (role, node) order."""
    folded: dict[tuple[str, str, str], tuple[set[int], set[int]]] = {}
    for p in placements:
        gpus, pids = folded.setdefault((p.role, p.node, p.source), (set(), set()))
        gpus.update(p.gpus)
        pids.update(p.pids)
    return [RolePlacement(role, node, tuple(sorted(gpus)), tuple(sorted(pids)), source)
            for (role, node, source), (gpus, pids) in sorted(folded.items())]


def device_map_of(placements: Iterable[RolePlacement]) -> dict[str, list[int]]:
    """Role → local GPU indices, the job's ``device_map`` (attribution) from its placements (union over nodes)."""
    out: dict[str, set[int]] = {}
    for p in placements:
        if p.gpus:
            out.setdefault(p.role, set()).update(p.gpus)
    return {role: sorted(gpus) for role, gpus in sorted(out.items())}


def gpus_by_role(placements: Iterable[RolePlacement], device_map: Mapping[str, Iterable[int]],
                 hostnames: Iterable[str]) -> dict[str, dict[str, list[int]]]:
    """Role → node → local GPUs: from the placements; a job that registered none (a typed device map) on its only
    node. Colocated roles list the same GPUs."""
    out: dict[str, dict[str, list[int]]] = {}
    placements, hostnames = list(placements), list(hostnames)
    for p in placements:
        if p.gpus:
            out.setdefault(p.role, {})[p.node] = sorted(set(out.get(p.role, {}).get(p.node, [])) | set(p.gpus))
    if not placements and len(hostnames) == 1:
        out = {role: {hostnames[0]: sorted(gpus)} for role, gpus in sorted(device_map.items()) if gpus}
    return out
