"""Building metric families with client_python's public API (``labels=`` + ``add_metric``), the one way every
series of /metrics is made.

A family holds one sample per item whose value is known (unknown = absent, never 0), and is left out when it has
none. ``simulated`` is a label of every sample of a family or of none: a family with any sample from a simulated
node says ``simulated="true"`` on those and ``simulated=""`` on the others, which Prometheus stores as no label
at all, so a real node's series keep dcgm-exporter's label set; a family of real nodes only has no such label.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trimtab.api.metrics.text_family import LabelTexts, TextFamily

SIMULATED = "simulated"


class Spec(NamedTuple):
    """One family: its name, its help text, and the value of an item (None: the item has no sample)."""

    name: str
    help: str
    value_of: Callable


class Row(NamedTuple):
    """One sample: its labels (without ``simulated``), whether its data is synthetic, and its value."""

    labels: dict[str, str]
    simulated: bool
    value: float


def finite(value) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


def family(kind: type, name: str, help_text: str, rows: Sequence[Row]) -> Metric:
    """A ``GaugeMetricFamily`` or ``CounterMetricFamily`` of ``rows`` (at least one)."""
    names: list[str] = []
    for row in rows:
        names.extend(n for n in row.labels if n not in names)
    marked = any(row.simulated for row in rows)
    metric = kind(name, help_text, labels=names + [SIMULATED] if marked else names)
    for row in rows:
        values = [row.labels.get(n, "") for n in names]
        metric.add_metric(values + ["true" if row.simulated else ""] if marked else values, row.value)
    return metric


def gauges(specs: Iterable[Spec], items: Sequence, labels_of: Callable[[object], dict[str, str]],
           simulated_of: Callable[[object], bool]) -> Iterator[Metric]:
    """One gauge family per spec, one sample per item whose value is known; families with no sample left out.
    Each item's labels are taken and escaped once for all the specs (:class:`TextFamily`)."""
    texts: Optional[LabelTexts] = None
    for name, help_text, value_of in specs:
        rows = [(i, value) for i, item in enumerate(items) if (value := finite(value_of(item))) is not None]
        if rows:
            if texts is None:
                texts = LabelTexts([labels_of(item) for item in items], [simulated_of(item) for item in items],
                                   SIMULATED)
            yield TextFamily(name, help_text, texts, rows)


def counter(name: str, help_text: str, rows: Sequence[Row]) -> Iterator[Metric]:
    """A counter family (``name`` without ``_total``; its samples get it) of ``rows``, left out when empty."""
    if rows:
        yield family(CounterMetricFamily, name, help_text, rows)
