"""Gauge families written straight into the text format, one line a sample, without a ``Sample`` or a labels dict
per sample.

A 1 000-GPU scrape is ~24 000 gauge samples in ~25 families, every GPU with the same five labels in each. Built the
client_python way (``add_metric``: a labels dict and a ``Sample`` a sample, then each label set looked up again to
write it) that took ~0.8 s of a ~1.5 s scrape under cProfile on the 2-core dev machine (issue 39). Here an item's
labels are escaped once a scrape (:class:`LabelTexts`) and each family is a list of ready lines.

A :class:`TextFamily` is still a prometheus_client ``Metric``: its ``samples`` are built on demand, so
``generate_latest`` of a registry holding it writes the same bytes as :func:`~trimtab.api.metrics.render.
text_exposition` (a test holds the two to that).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString


@lru_cache(maxsize=256)  # label names: the few that /metrics uses
def _label_name(name: str) -> str:
    return openmetrics.escape_label_name(name, openmetrics.UNDERSCORES)


def label_pair(name: str, value: str) -> str:
    """``name="value"``, escaped as ``generate_latest`` escapes it (a label value: backslash, newline and double
    quote backslash-escaped, as ``openmetrics._escape`` with ALLOWUTF8 does)."""
    escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return f'{_label_name(name)}="{escaped}"'


def label_text(labels: Sequence[tuple[str, str]]) -> str:
    """``{a="1",b="2"}`` of ``labels`` sorted by name, as ``generate_latest`` writes it ("" without labels)."""
    return "{" + ",".join(label_pair(k, v) for k, v in sorted(labels)) + "}" if labels else ""


def go_float(value: float) -> str:
    """``floatToGoString`` of a finite float, without its checks for infinities and NaN on the common path."""
    text = repr(value)
    return floatToGoString(value) if value > 0 and text.find(".") > 6 else text


class LabelTexts:
    """Per item of a scrape: its label names, values, ``simulated`` flag, and its escaped label text for a family
    with and without the ``simulated`` label — computed once, shared by every family of those items."""

    def __init__(self, labels: Sequence[dict[str, str]], simulated: Sequence[bool], simulated_label: str):
        self.keys = [tuple(d) for d in labels]
        self.values = [tuple(d.values()) for d in labels]
        self.simulated = list(simulated)
        self.simulated_label = simulated_label
        self._plain: list = [None] * len(self.keys)
        self._marked: list = [None] * len(self.keys)

    def text(self, i: int, marked: bool) -> str:
        """Item ``i``'s label text, with ``simulated="true"``/``simulated=""`` when the family is ``marked``."""
        cache = self._marked if marked else self._plain
        found = cache[i]
        if found is None:
            pairs = list(zip(self.keys[i], self.values[i]))
            if marked:
                pairs.append((self.simulated_label, "true" if self.simulated[i] else ""))
            found = cache[i] = label_text(pairs)
        return found


class TextFamily(Metric):
    """A gauge family of ``(item index, value)`` rows over ``items`` (a :class:`LabelTexts`): its label names are
    the union of its rows' in first-seen order, plus ``simulated`` when any row is simulated; a row without one of
    those labels has it as "" (as ``family()`` of families.py writes it)."""

    def __init__(self, name: str, documentation: str, items: LabelTexts, rows: Sequence[tuple[int, float]]):
        # Metric.__init__ would set ``samples`` (a property here); what it checks and sets, done by hand.
        probe = GaugeMetricFamily(name, documentation)
        self.name, self.documentation, self.unit, self.type = probe.name, documentation, "", "gauge"
        self.items, self.rows = items, rows
        names: list[str] = []
        first = items.keys[rows[0][0]]
        if all(items.keys[i] == first for i, _ in rows):
            names = list(first)
            self._uniform = True
        else:
            for i, _ in rows:
                names.extend(n for n in items.keys[i] if n not in names)
            self._uniform = False
        self.marked = any(items.simulated[i] for i, _ in rows)
        self.label_names = names + [items.simulated_label] if self.marked else names

    def _values(self, i: int) -> list[str]:
        own = dict(zip(self.items.keys[i], self.items.values[i]))
        values = [own.get(n, "") for n in self.label_names[:len(self.label_names) - self.marked]]
        return values + ["true" if self.items.simulated[i] else ""] if self.marked else values

    def lines(self, escaped_name: str) -> list[str]:
        """The sample lines (``escaped_name`` is this family's name escaped once by the caller)."""
        items, marked = self.items, self.marked
        if self._uniform:
            return [f"{escaped_name}{items.text(i, marked)} {go_float(v)}\n" for i, v in self.rows]
        return [f"{escaped_name}{label_text(list(zip(self.label_names, self._values(i))))} {go_float(v)}\n"
                for i, v in self.rows]

    @property
    def samples(self):  # noqa: D401 - prometheus_client's attribute, built for whoever asks (generate_latest)
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for i, value in self.rows:
            family.add_metric(self._values(i), value)
        return family.samples
