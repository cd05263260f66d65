"""The balance report of one node over a window: its GPUs' window means and one row per rule.

Input is per-GPU window aggregates (means and maxima of each metric); the rows are the rule set's GPU rules, graded
by :mod:`trimtab.rebalancer.grading` (the controller's own readings). Output is a :class:`BalanceReport` that
`trimtab check`, the API and Prometheus all render; nothing here reads a store or talks to a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

from trimtab.rebalancer.grading import (ACT, NO_DATA, OK, SEVERITY, UNSUPPORTED, WATCH, Verdict, no_job_data,
                                        node_rows)
from trimtab.rebalancer.rules import RuleSet, default_rules
from trimtab.rebalancer.signals import GpuWindow, mem_used_pct, pcie_pct_of_peak


@dataclass
class GpuRow:
    index: int
    uuid: str
    name: str
    n_samples: int
    util_pct: Optional[float]
    sm_active_pct: Optional[float]
    mem_used_pct: Optional[float]
    pcie_tx_bytes_per_s: Optional[float]
    pcie_rx_bytes_per_s: Optional[float]
    pcie_pct_of_peak: Optional[float]
    nvlink_tx_bytes_per_s: Optional[float]
    nvlink_rx_bytes_per_s: Optional[float]
    nvlink_supported: bool


@dataclass
class BalanceReport:
    hostname: str
    simulated: bool
    window_s: float
    gpus: list[GpuRow]
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def status(self) -> str:
        worst = max((SEVERITY[v.status] for v in self.verdicts), default=0)
        return {0: OK, 1: WATCH, 2: ACT}[worst]

    @property
    def balanced(self) -> bool:
        return self.status != ACT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BalanceReport":
        """Inverse of :meth:`to_dict` (extra keys, e.g. from the API, are ignored)."""
        def pick(klass, item):
            names = {f for f in klass.__dataclass_fields__}
            return klass(**{k: v for k, v in item.items() if k in names})

        return cls(hostname=d["hostname"], simulated=bool(d["simulated"]), window_s=float(d["window_s"]),
                   gpus=[pick(GpuRow, g) for g in d.get("gpus", [])],
                   verdicts=[pick(Verdict, v) for v in d.get("verdicts", [])])


def gpu_rows(windows: Sequence[GpuWindow]) -> list[GpuRow]:
    return [
        GpuRow(
            index=w.gpu_index, uuid=w.gpu_uuid, name=w.gpu_name, n_samples=w.n_samples,
            util_pct=w.mean.get("util_pct"), sm_active_pct=w.mean.get("sm_active_pct"), mem_used_pct=mem_used_pct(w),
            pcie_tx_bytes_per_s=w.mean.get("pcie_tx_bytes_per_s"), pcie_rx_bytes_per_s=w.mean.get("pcie_rx_bytes_per_s"),
            pcie_pct_of_peak=pcie_pct_of_peak(w),
            nvlink_tx_bytes_per_s=w.mean.get("nvlink_tx_bytes_per_s"), nvlink_rx_bytes_per_s=w.mean.get("nvlink_rx_bytes_per_s"),
            nvlink_supported=w.nvlink_link_count is not None,
        )
        for w in sorted(windows, key=lambda w: w.gpu_index)
    ]


def assess(hostname: str, simulated: bool, window_s: float, windows: Sequence[GpuWindow],
           rules: Optional[RuleSet] = None, job_verdicts: Optional[Sequence[Verdict]] = None) -> BalanceReport:
    """Grade one node's window by ``rules`` (default: the shipped rules). Job rows say "no job data" until jobs
    report through the hook."""
    rules = rules or default_rules()
    report = BalanceReport(hostname=hostname, simulated=simulated, window_s=window_s, gpus=gpu_rows(windows))
    report.verdicts.extend(node_rows(rules, windows))
    report.verdicts.extend(job_verdicts if job_verdicts else no_job_data(rules))
    return report


__all__ = ["ACT", "NO_DATA", "OK", "SEVERITY", "UNSUPPORTED", "WATCH", "BalanceReport", "GpuRow", "GpuWindow",
           "Verdict", "assess", "gpu_rows"]
