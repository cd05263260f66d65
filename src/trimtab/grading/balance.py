"""The balance report of one node over a window: its GPUs' window means and one row per rule.

Input is per-GPU window aggregates (means and maxima of each metric); the rows are the rule set's GPU rules, graded
by :mod:`trimtab.grading.grading` (the controller's own readings). Output is a :class:`BalanceReport` that
`trimtab check`, the API and Prometheus all render; nothing here reads a store or talks to a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

from trimtab.contract.statuses import ACT, NO_DATA, OK, SEVERITY, UNSUPPORTED, WATCH
from trimtab.grading.grading import Verdict, no_job_data, node_rows
from trimtab.grading.rules import RuleSet, default_rules
from trimtab.grading.signals import GpuWindow, mem_used_pct, pcie_pct_of_peak


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
    # Freshness (node_report.py): how old the node's newest sample was when graded, the node's sampling interval
    # measured from its samples, and the age past which its samples are no current verdict (None: not judged).
    newest_sample_age_s: Optional[float] = None
    sample_interval_s: Optional[float] = None
    stale_after_s: Optional[float] = None
    # The node's clock (trimtab.store.clocks): receiver − node, seconds (None: not measured), and a line saying
    # what is wrong with it (None: nothing). A node heard from whose samples all lie outside the window (its clock
    # is behind, or its batches are refused) is listed with no GPUs, stale, rather than left out.
    clock_skew_s: Optional[float] = None
    clock_note: Optional[str] = None

    @property
    def status(self) -> str:
        worst = max((SEVERITY[v.status] for v in self.verdicts), default=0)
        return {0: OK, 1: WATCH, 2: ACT}[worst]

    @property
    def balanced(self) -> bool:
        return self.status != ACT

    @property
    def stale(self) -> bool:
        """The node's newest sample is too old to grade it now: its agent stopped or cannot reach the store, or
        it is heard from but its samples lie outside the window (its clock)."""
        if not self.gpus and self.clock_note:
            return True
        return (self.newest_sample_age_s is not None and self.stale_after_s is not None
                and self.newest_sample_age_s > self.stale_after_s)

    def staleness(self) -> str:
        """One line saying why the node is stale (empty when it is not)."""
        if not self.stale:
            return ""
        if self.newest_sample_age_s is None:
            age = "no sample of it is stored"
        else:
            age = f"its newest sample is {self.newest_sample_age_s:.1f} s old, more than {self.stale_after_s:.1f} s"
            if self.sample_interval_s is not None:
                age += f" ({self.sample_interval_s:g} s sampling interval)"
        if self.clock_note:
            return f"node {self.hostname} is STALE: {age}; {self.clock_note}"
        return f"node {self.hostname} is STALE: {age}: is `trimtab agent` still running there and reaching the store?"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        d["stale"] = self.stale
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BalanceReport":
        """Inverse of :meth:`to_dict` (extra keys, e.g. from the API, are ignored)."""
        def pick(klass, item):
            names = {f for f in klass.__dataclass_fields__}
            return klass(**{k: v for k, v in item.items() if k in names})

        return cls(hostname=d["hostname"], simulated=bool(d["simulated"]), window_s=float(d["window_s"]),
                   gpus=[pick(GpuRow, g) for g in d.get("gpus", [])],
                   verdicts=[pick(Verdict, v) for v in d.get("verdicts", [])],
                   newest_sample_age_s=d.get("newest_sample_age_s"), sample_interval_s=d.get("sample_interval_s"),
                   stale_after_s=d.get("stale_after_s"), clock_skew_s=d.get("clock_skew_s"),
                   clock_note=d.get("clock_note"))


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
