"""The balance verdict of one node over a window: the seed's ``check_balance.py`` made real.

Input is per-GPU window aggregates (means and maxima of each metric), thresholds come from
``rules.toml`` (data, not code). Output is a :class:`BalanceReport` that `trimtab check`, the API and
Prometheus all render; nothing here reads a store or talks to a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

OK, WATCH, ACT, NO_DATA, UNSUPPORTED = "ok", "watch", "act", "no_data", "unsupported"
SEVERITY = {OK: 0, NO_DATA: 0, UNSUPPORTED: 0, WATCH: 1, ACT: 2}


class GpuWindow(Protocol):
    """What the verdict needs of one GPU's window (``trimtab.store.queries.GpuAggregate`` satisfies it)."""

    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    pcie_peak_bytes_per_s: Optional[float]
    nvlink_link_count: Optional[int]
    n_samples: int
    mean: Mapping[str, Optional[float]]
    max: Mapping[str, Optional[float]]


def load_thresholds(overrides: Optional[Mapping[str, Mapping[str, Any]]] = None) -> dict[str, dict[str, Any]]:
    """The node-level checks' thresholds, taken from the shipped ``rules.toml`` (one source for check and controller)."""
    from trimtab.rebalancer.rules import load_rules, thresholds

    data = thresholds(load_rules())
    for check, values in (overrides or {}).items():
        if check not in data:
            raise ValueError(f"unknown threshold check {check!r}; known: {', '.join(data)}")
        data[check].update(values)
    return data


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
class Verdict:
    check: str
    status: str  # ok | watch | act | no_data | unsupported
    value: Optional[float]
    unit: str
    healthy_below: Optional[float]
    act_above: Optional[float]
    message: str
    advice: Optional[str] = None
    gpu_index: Optional[int] = None  # the GPU that set the value, where one did


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


def _grade(value: float, t: Mapping[str, Any]) -> str:
    if value > t["act_above"]:
        return ACT
    if value >= t["healthy_below"]:
        return WATCH
    return OK


def _mem_pct(w: GpuWindow) -> Optional[float]:
    used, reserved, total = w.mean.get("mem_used_bytes"), w.mean.get("mem_reserved_bytes"), w.mean.get("mem_total_bytes")
    if used is None or not total:
        return None
    return 100.0 * (used + (reserved or 0.0)) / total


def _pcie_pct(w: GpuWindow) -> Optional[float]:
    tx, rx = w.mean.get("pcie_tx_bytes_per_s"), w.mean.get("pcie_rx_bytes_per_s")
    if (tx is None and rx is None) or not w.pcie_peak_bytes_per_s:
        return None
    return 100.0 * max(tx or 0.0, rx or 0.0) / w.pcie_peak_bytes_per_s


def gpu_rows(windows: Sequence[GpuWindow]) -> list[GpuRow]:
    return [
        GpuRow(
            index=w.gpu_index, uuid=w.gpu_uuid, name=w.gpu_name, n_samples=w.n_samples,
            util_pct=w.mean.get("util_pct"), sm_active_pct=w.mean.get("sm_active_pct"), mem_used_pct=_mem_pct(w),
            pcie_tx_bytes_per_s=w.mean.get("pcie_tx_bytes_per_s"), pcie_rx_bytes_per_s=w.mean.get("pcie_rx_bytes_per_s"),
            pcie_pct_of_peak=_pcie_pct(w),
            nvlink_tx_bytes_per_s=w.mean.get("nvlink_tx_bytes_per_s"), nvlink_rx_bytes_per_s=w.mean.get("nvlink_rx_bytes_per_s"),
            nvlink_supported=w.nvlink_link_count is not None,
        )
        for w in sorted(windows, key=lambda w: w.gpu_index)
    ]


def _spread_verdict(windows: Sequence[GpuWindow], t: Mapping[str, Any]) -> Verdict:
    signal = t["signal"]
    if any(w.mean.get(signal) is None for w in windows):
        signal = t["fallback_signal"]
    values = [(w.mean.get(signal), w.gpu_index) for w in windows if w.mean.get(signal) is not None]
    label = "SM activity" if signal == "sm_active_pct" else "utilization"
    base = dict(check="utilization_spread", unit="pts", healthy_below=t["healthy_below"], act_above=t["act_above"])
    if not values:
        return Verdict(status=NO_DATA, value=None, message="no utilization readings in the window", **base)
    if len(values) < 2:
        return Verdict(status=OK, value=0.0, message=f"one GPU: no spread to measure ({label})", **base)
    hi, lo = max(values), min(values)
    spread = hi[0] - lo[0]
    status = _grade(spread, t)
    msg = f"{label} spread {spread:.1f} pts (GPU{hi[1]} {hi[0]:.1f} % vs GPU{lo[1]} {lo[0]:.1f} %)"
    return Verdict(status=status, value=spread, message=msg, advice=t["advice"] if status != OK else None,
                   gpu_index=hi[1], **base)


def _per_gpu_verdict(check: str, windows: Sequence[GpuWindow], t: Mapping[str, Any], pct) -> Verdict:
    values = [(pct(w), w.gpu_index) for w in windows]
    known = [(v, i) for v, i in values if v is not None]
    base = dict(check=check, unit="%", healthy_below=t["healthy_below"], act_above=t["act_above"])
    if not known:
        return Verdict(status=UNSUPPORTED, value=None, message=f"{check}: not measured on these GPUs", **base)
    worst, idx = max(known)
    status = _grade(worst, t)
    msg = f"highest GPU{idx} at {worst:.1f} % of {'link peak' if check == 'pcie' else 'memory'}"
    return Verdict(status=status, value=worst, message=msg, advice=t["advice"] if status != OK else None, gpu_index=idx, **base)


def assess(hostname: str, simulated: bool, window_s: float, windows: Sequence[GpuWindow],
           thresholds: Optional[Mapping[str, Mapping[str, Any]]] = None,
           job_verdicts: Optional[Sequence[Verdict]] = None) -> BalanceReport:
    """Grade one node's window. Job-level checks say "no job data" until jobs report through the hook."""
    t = thresholds or load_thresholds()
    report = BalanceReport(hostname=hostname, simulated=simulated, window_s=window_s, gpus=gpu_rows(windows))
    report.verdicts.append(_spread_verdict(windows, t["utilization_spread"]))
    report.verdicts.append(_per_gpu_verdict("pcie", windows, t["pcie"], _pcie_pct))
    report.verdicts.append(_per_gpu_verdict("memory", windows, t["memory"], _mem_pct))
    if job_verdicts:
        report.verdicts.extend(job_verdicts)
    else:
        for check in ("step_composition", "fragmentation", "collective_latency"):
            report.verdicts.append(Verdict(check=check, status=NO_DATA, value=None, unit="", healthy_below=None,
                                           act_above=None, message="no job data (jobs report through the trainer hook)"))
    return report
