"""The knobs a job exposes to the rebalancer (value and bounds), checked on the job's side too.

The API already refuses a change outside the declared bounds; the job checks again because its own bounds can be
narrower than the server's (after an OOM, ``batch_size``'s ceiling drops below the size that failed) and because
a training process must never trust what arrives over the network. Integer knobs (declared with three ints, as
the API decides) stay ints: a batch size of 12.0 would break ``range()`` in the user's loop.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional, Sequence, Union

from trimtab.contract.knobs import KnobDeclaration, Number

KnobSpecLike = Union[Sequence[Number], Mapping[str, Number]]  # (start, min, max) or {"value", "min", "max"}

log = logging.getLogger("trimtab.trainer")


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Knob:
    value: Number
    min: Number
    max: Number
    integer: bool

    def clamp(self, value: float) -> Number:
        value = min(max(value, self.min), self.max)
        return int(value) if self.integer else float(value)


def parse_knob(name: str, spec: KnobSpecLike) -> Knob:
    """A knob from ``(start, min, max)`` or ``{"value", "min", "max"}``; a start outside the bounds is clamped
    (with a warning) rather than refused, so a job is never stopped by its own monitoring."""
    if isinstance(spec, Mapping):
        declared = KnobDeclaration.from_wire(spec)
    else:
        start, lo, hi = spec
        declared = KnobDeclaration(start, lo, hi)
    start, lo, hi = declared.value, declared.min, declared.max
    if not all(_is_number(v) for v in (start, lo, hi)):
        raise ValueError(f"knob {name!r}: start, min and max must be finite numbers, got {spec!r}")
    if lo > hi:
        raise ValueError(f"knob {name!r}: min {lo} is above max {hi}")
    knob = Knob(start, lo, hi, integer=declared.integer)
    clamped = knob.clamp(start)
    if clamped != start:
        log.warning("trimtab: knob %s starts at %s, outside [%s, %s]: clamped to %s", name, start, lo, hi, clamped)
    knob.value = clamped
    return knob


class KnobSet:
    """The job's knobs. ``values`` is a read-only live view; only the hook's step boundary changes it."""

    def __init__(self, specs: Optional[Mapping[str, KnobSpecLike]] = None):
        self._knobs = {name: parse_knob(name, spec) for name, spec in (specs or {}).items()}
        self._values = {name: k.value for name, k in self._knobs.items()}
        self.values: Mapping[str, Number] = MappingProxyType(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._knobs

    def __getitem__(self, name: str) -> Knob:
        return self._knobs[name]

    @property
    def names(self) -> list[str]:
        return list(self._knobs)

    def check(self, name: str, value: object) -> tuple[Optional[Number], Optional[str]]:
        """``(value as the knob's type, None)`` if the job accepts ``value`` for ``name``, else ``(None, why)``."""
        knob = self._knobs.get(name)
        if knob is None:
            return None, f"the job declared no knob {name!r} (declared: {', '.join(self._knobs) or 'none'})"
        if not _is_number(value):
            return None, f"{name}: {value!r} is not a finite number"
        if knob.integer and not float(value).is_integer():
            return None, f"{name} is an integer knob; {value!r} has a fraction"
        if not knob.min <= value <= knob.max:
            return None, f"{name}={value!r} is outside the job's bounds [{knob.min}, {knob.max}]"
        return (int(value) if knob.integer else float(value)), None

    def set(self, name: str, value: Number) -> Number:
        """Sets ``name`` (clamped to its bounds); returns the previous value."""
        knob = self._knobs[name]
        old, knob.value = knob.value, knob.clamp(value)
        self._values[name] = knob.value
        return old

    def lower_ceiling(self, name: str, ceiling: float) -> None:
        """Lowers ``name``'s max (never below its min, never up): after an OOM the job refuses to go back."""
        knob = self._knobs[name]
        new_max = knob.clamp(min(ceiling, knob.max))
        knob.max = new_max

    def declaration(self) -> dict[str, dict[str, Number]]:
        """The knobs as the API's registration wants them."""
        return {name: KnobDeclaration(k.value, k.min, k.max).to_wire() for name, k in self._knobs.items()}
