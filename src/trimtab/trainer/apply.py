"""Who applies a knob, and the word that it took effect: the contract behind every acknowledgement.

A change the rebalancer queues is acknowledged "applied at step N" only when the code that owns the knob says so.
In a plain PyTorch loop the loop owns every knob it reads from ``hook.knobs``: reading the value at the boundary is
applying it, so the hook acknowledges at once. A framework adapter owns the knobs it declares through an
*applier*: the hook hands it a :class:`KnobChange` at the step boundary, and the applier answers with
``change.applied(at_step)`` (now, or later — e.g. when the framework's next call really carried the value) or
``change.refused(reason)``. A refused change never counts as applied: the hook restores the old value and tells
the server, which closes the rebalancer's decision as "refused".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Union

Number = Union[int, float]
from trimtab.contract.statuses import APPLIED, PENDING, REFUSED


@dataclass
class KnobChange:
    """One knob moving from ``old`` to ``new`` from ``step`` on; ``change_id`` None for the hook's own moves (an
    OOM halving the batch), which need no acknowledgement."""

    knob: str
    old: Number
    new: Number
    step: int
    change_id: Optional[int] = None
    _resolve: Optional[Callable[["KnobChange"], None]] = field(default=None, repr=False, compare=False)
    status: str = PENDING
    applied_at_step: Optional[int] = None
    reason: Optional[str] = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def applied(self, at_step: Optional[int] = None) -> bool:
        """The knob's owner says the new value is in effect from ``at_step`` (default: the boundary's step).
        Only the first answer counts; returns whether this one did."""
        return self._settle(APPLIED, at_step=self.step if at_step is None else int(at_step))

    def refused(self, reason: str) -> bool:
        """The knob's owner cannot apply the value; ``reason`` says why (kept on the server)."""
        return self._settle(REFUSED, reason=str(reason) or "no reason given")

    @property
    def settled(self) -> bool:
        return self.status != PENDING

    def _settle(self, status: str, at_step: Optional[int] = None, reason: Optional[str] = None) -> bool:
        with self._lock:
            if self.status != PENDING:
                return False
            self.status, self.applied_at_step, self.reason = status, at_step, reason
        if self._resolve is not None:
            self._resolve(self)
        return True


class KnobApplier(Protocol):
    """What a framework adapter implements for the knobs it owns."""

    def apply(self, change: KnobChange) -> None:
        """Install ``change.new`` where the framework reads it, then call ``change.applied()`` (now or once the
        framework used it) or ``change.refused(reason)``."""
