"""Out-of-memory handling inside the training loop (``hook.oom_guard()``): the step is lost, the batch-size knob is
halved from the next step and never goes back up to the size that failed, and the failed attempt's memory is
given back. Apart from the hook because it runs in whichever thread hit the error (a generation worker too): it
only records, under the hook's lock, what the next step boundary agrees on (:meth:`OomHandler.take_proposal`)
and reports (:meth:`OomHandler.take_report`)."""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from trimtab.trainer.knobs import KnobSet, Number
from trimtab.trainer.memory import is_oom
from trimtab.trainer.timing import cuda_in_use

log = logging.getLogger("trimtab.trainer")


@dataclass(frozen=True)
class OomEvent:
    """An out-of-memory error ``oom_guard`` caught: the step it lost and what the batch size becomes."""

    step: int
    batch_size: Optional[Number]
    new_batch_size: Optional[Number]
    error: str


class OomGuard:
    """``with hook.oom_guard():`` — swallows an out-of-memory error (any other passes) and hands it on."""

    __slots__ = ("_oom",)

    def __init__(self, oom: "OomHandler"):
        self._oom = oom

    def __enter__(self) -> "OomGuard":
        self._oom.last = None
        return self

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is None or not is_oom(exc):
            return False
        # The traceback's finished frames hold the tensors of the failed attempt: free them before emptying the
        # cache, or empty_cache() cannot give their blocks back.
        traceback.clear_frames(tb)
        self._oom.handle(exc)
        return True


class OomHandler:
    """Counts OOMs, lowers the ``knob``'s ceiling below the size that failed and proposes half of it.

    ``lock`` is the hook's (the knobs are shared with the step boundary); ``step`` says which step is running."""

    def __init__(self, knobs: KnobSet, knob: str, lock: threading.Lock, step: Callable[[], int]):
        self._knobs, self.knob, self._lock, self._step = knobs, knob, lock, step
        self.ooms = 0
        self.last: Optional[OomEvent] = None  # set until the next guarded block
        self._proposal: Optional[float] = None
        self._report: Optional[dict] = None

    def guard(self) -> OomGuard:
        return OomGuard(self)

    def handle(self, exc: BaseException) -> None:
        failed = new = None
        with self._lock:
            self.ooms += 1
            if self.knob in self._knobs:
                knob = self._knobs[self.knob]
                failed = knob.value
                new = knob.clamp(failed / 2)
                self._knobs.lower_ceiling(self.knob, (failed - 1) if knob.integer else new)
                self._proposal = new if self._proposal is None else min(self._proposal, new)
            self._report = {"ooms": self.ooms, "failed_batch_size": failed, "new_batch_size": new}
        step = self._step()
        self.last = OomEvent(step, failed, new, str(exc)[:300])
        log.warning("trimtab: out of memory at step %d with %s=%s; %s from the next step (%s)", step,
                    self.knob, failed, new, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        if cuda_in_use():
            torch.cuda.empty_cache()

    def take_proposal(self) -> Optional[float]:
        """The smallest batch size proposed since the last call (None: no OOM). The caller holds the lock."""
        proposal, self._proposal = self._proposal, None
        return proposal

    def take_report(self) -> Optional[dict]:
        """What the next step report says about the OOMs since the last call (None: none)."""
        with self._lock:
            report, self._report = self._report, None
        return report
