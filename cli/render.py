"""Human-readable rendering of balance reports: a per-GPU table and one line per verdict."""

from __future__ import annotations

from typing import Optional

from trimtab.rebalancer.balance import ACT, NO_DATA, OK, UNSUPPORTED, WATCH, BalanceReport

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
    lines.append("")
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)
