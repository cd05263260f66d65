"""Per-node series: the balance verdicts `trimtab check` prints (``trimtab_balance_*``, label ``check``) and
``trimtab_node_simulated`` (0 or 1 for every node, for joins)."""

from __future__ import annotations

from typing import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from trimtab.api.metrics.families import Row, Spec, family, gauges
from trimtab.contract.statuses import SEVERITY
from trimtab.grading.balance import BalanceReport

BALANCE_WINDOW_S = 30.0  # the window `trimtab check` grades by default


def balance_families(reports: list[BalanceReport]) -> Iterator[Metric]:
    """``trimtab_balance_status`` (0 ok or no data, 1 watch, 2 act) and ``trimtab_balance_value`` per check."""
    verdicts = [(r, v) for r in reports for v in r.verdicts]
    specs = (
        Spec("trimtab_balance_status", f"Balance verdict of a check over the last {BALANCE_WINDOW_S:.0f} s: 0 ok (or "
             "no data), 1 watch, 2 act (as `trimtab check`).", lambda rv: SEVERITY[rv[1].status]),
        Spec("trimtab_balance_value", f"The value a check graded over the last {BALANCE_WINDOW_S:.0f} s: "
             "utilization_spread in points, pcie in % of link peak, memory in % of total; absent without data.",
             lambda rv: rv[1].value),
    )
    yield from gauges(specs, verdicts, lambda rv: {"hostname": rv[0].hostname, "check": rv[1].check},
                      lambda rv: rv[0].simulated)


def node_families(simulated_by_host: Mapping[str, bool]) -> Iterator[Metric]:
    """``trimtab_node_simulated``: its value says it, so it carries no ``simulated`` label."""
    rows = [Row({"hostname": hostname}, False, 1.0 if simulated else 0.0)
            for hostname, simulated in sorted(simulated_by_host.items())]
    if rows:
        yield family(GaugeMetricFamily, "trimtab_node_simulated",
                     "1 if the node's data is synthetic (a simulated node), else 0.", rows)
