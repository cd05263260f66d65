"""The kinds of value the contract's fields take: a type, its bounds and how the store keeps it.

The API refuses a value outside its field's kind (422 naming the field); the hook cleans what it sends by the same
kind (:func:`clean`), so a report is never refused for one odd value: a value above its bound is clamped, one
below it, non-finite or of the wrong type is left out. One kind serves many fields, so a new field of a known kind
needs no code anywhere, only its entry in the contract.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Optional

NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"  # never meaningful in a name; PostgreSQL rejects NUL in text outright
NUMBER = "number"  # a knob value: integral values stay integers (batch sizes, depths), others are floats


@dataclass(frozen=True)
class Kind:
    """``type``: int, float, str, dict (named scalars: name → float) or NUMBER. Bounds: ``ge``/``le`` on numbers
    (on a dict's values), ``min_length``/``max_length`` on text (``max_length``: entries of a dict), ``pattern``
    on text. ``storage``: the store's column type (bigint, integer, double, text, json)."""

    type: Any
    ge: Optional[float] = None
    le: Optional[float] = None
    storage: str = "double"
    min_length: Optional[int] = None
    max_length: Optional[int] = None
    pattern: Optional[str] = None
    key_max_length: Optional[int] = None  # a dict's names


@dataclass(frozen=True)
class Spec:
    """One field of a message: its name on the wire, its kind and what it means (the API documents it so)."""

    name: str
    kind: Kind
    doc: str


def clean(kind: Kind, value: Any) -> Any:
    """``value`` as the API takes it for a field of ``kind``, or None (leave the field out): a number above its
    bound is clamped to it; below its bound, non-finite, a boolean or not a number at all, it is left out. Text
    that breaks its length or pattern is left out; a dict keeps the entries that pass (see :func:`scalars`)."""
    if value is None:
        return None
    if kind.type is dict:
        return scalars(kind, value) or None
    if kind.type is str:
        ok = isinstance(value, str) and (kind.min_length or 0) <= len(value) <= (kind.max_length or len(value))
        return value if ok and (kind.pattern is None or re.match(kind.pattern, value)) else None
    number = _number(value, kind.ge)
    if number is None:
        return None
    if kind.le is not None and number > kind.le:
        number = kind.le
    if kind.type is int or (kind.type == NUMBER and isinstance(value, int)):
        return int(round(number))
    return float(number)


def scalars(kind: Kind, values: Any) -> dict[str, float]:
    """Named scalars as the API takes them: finite numbers within the kind's bounds under printable names (at
    most ``key_max_length`` characters), at most ``max_length`` of them (the rest, by name, are left out rather
    than have the whole message refused)."""
    out: dict[str, float] = {}
    if not hasattr(values, "items"):
        return out
    most = kind.max_length if kind.max_length is not None else math.inf
    longest = kind.key_max_length if kind.key_max_length is not None else math.inf
    for key, value in sorted(values.items(), key=lambda kv: str(kv[0])):
        key, number = str(key), _number(value, kind.ge)
        if number is None or (kind.le is not None and number > kind.le):
            continue
        if 0 < len(key) <= longest and key.isprintable() and len(out) < most:
            out[key] = float(number)
    return out


def _number(value: Any, ge: Optional[float]) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    if ge is not None and value < ge:
        return None
    return value
