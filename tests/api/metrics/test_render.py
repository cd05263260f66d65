"""/metrics is written as prometheus_client would write it, byte for byte. What that costs against
generate_latest (issue 39: 0.6 s of an 80-GPU scrape, ~90 µs a sample) is measured by bench/metrics_render.py, not
asserted here."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from trimtab.api.metrics import TrimtabCollector
from trimtab.api.metrics.families import Spec, gauges
from trimtab.api.metrics.render import text_exposition

from .conftest import Feeder


class Listed:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def odd_families():
    """Counters (with _created), label values that need escaping, an info family (left to prometheus_client)."""
    counter = CounterMetricFamily("trimtab_odd_errors", "Help with a \\ and a\nnewline.", labels=["part", "why"])
    counter.add_metric(["gpus", 'a "quoted"\\ value\nover two lines'], 3, created=1_800_000_000.5)
    counter.add_metric(["balance", "ünïcode"], 1)
    gauge = GaugeMetricFamily("trimtab_odd_gauge", "Nan, inf and a stamp.", labels=["k"])
    gauge.add_metric(["nan"], float("nan"))
    gauge.add_metric(["inf"], float("inf"), timestamp=1_800_000_000.25)
    gauge.add_metric(["int"], 7)
    info = InfoMetricFamily("trimtab_odd", "An info family.", value={"version": "1"})
    return [counter, gauge, info, GaugeMetricFamily("trimtab_odd_unlabelled", "No labels.", value=2.5),
            *odd_gauges()]


def odd_gauges():
    """gauges() (written line by line, not through add_metric) over items whose label sets differ, whose values
    need escaping and Go's float spelling, some simulated: a family of one item, of items with the same labels,
    of items with different labels."""
    items = [({"job": "a", "mode": "auto"}, False, 31_500_000_000.0), ({"job": 'q"uo\\te\nd'}, True, 0.1 + 0.2),
             ({"job": "c", "mode": "advise", "extra": "ü"}, False, -1234567.5), ({"job": "d", "mode": "auto"}, True, 7)]
    specs = [Spec("trimtab_odd_all", "Every item.", lambda it: it[2]),
             Spec("trimtab_odd_same_labels", "Items 0 and 3.", lambda it: it[2] if it[0].get("mode") == "auto" else None),
             Spec("trimtab_odd_real_one", "Item 0, so no simulated label.", lambda it: 1e-7 if it is items[0] else None),
             Spec("trimtab_odd_none", "No item: left out.", lambda it: None)]
    return list(gauges(specs, items, lambda it: it[0], lambda it: it[1]))


def test_the_exposition_is_generate_latests_byte_for_byte(ctx):
    feed = Feeder(ctx)
    for i, scenario in enumerate(("actor-hot", "balanced")):
        feed.simulated(hostname=f"sim-{i}", scenario=scenario, n_gpus=4, ticks=3)
    metrics = list(TrimtabCollector(ctx).collect()) + odd_families()
    assert len(metrics) > 20
    assert text_exposition(metrics) == generate_latest(Listed(metrics))

