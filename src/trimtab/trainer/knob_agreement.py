"""A knob change's way through a job: staged from the server's answer, agreed on by every rank at a step boundary,
handed to the code that owns the knob, and settled (acknowledged, or refused and undone).

Apart from the hook because it is the one part that must give every rank the same answer at the same step: rank
0 takes the newest change it accepts, every rank adds what an OOM made it propose and its own ceilings, and one
``all_reduce(MIN)`` (:class:`~trimtab.trainer.dist.KnobSync`, whose docstring has the layout and its cost) makes
the result. Who owns a knob and how it answers is :mod:`trimtab.trainer.apply`.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable, Mapping, Optional

from trimtab.contract.knobs import PendingChange
from trimtab.trainer.apply import APPLIED, KnobApplier, KnobChange
from trimtab.trainer.dist import KnobSync, distributed
from trimtab.trainer.knobs import KnobSet, Number
from trimtab.trainer.oom import OomHandler
from trimtab.trainer.server_link import Reporter

log = logging.getLogger("trimtab.trainer")
ChangeCallback = Callable[[str, Number, Number, Optional[int]], None]
Agreed = Optional[tuple[int, str, Number]]  # (change_id, knob, value): the server change the ranks agreed on


class KnobAgreement:
    """The knob changes of one rank. ``appliers`` knob → its owner (the dict is the hook's, extended by
    ``claim_knobs``); ``declare(values)`` the registration body with those values (for a lowered ceiling);
    ``link`` the server link (None: standalone), set by the hook."""

    def __init__(self, knobs: KnobSet, appliers: dict[str, KnobApplier], oom: OomHandler, sync: KnobSync,
                 lock: threading.Lock, rank: int, declare: Callable[[Optional[Mapping[str, Number]]], dict]):
        self._knobs, self._appliers, self._oom, self._sync = knobs, appliers, oom, sync
        self._lock, self._rank, self._declare = lock, rank, declare
        self.link: Optional[Reporter] = None
        self.last_changes: list[KnobChange] = []  # the changes of the newest boundary, with how they settled
        self.callbacks: list[ChangeCallback] = []
        self._declared_max = {k: self._knobs[k].max for k in self._knobs.names}  # as the server knows them
        self._staged: dict[int, tuple] = {}  # change_id → (knob, value, reason), from the reporter thread
        self._seen: set[int] = set()  # change ids applied or refused: never again

    def stage(self, pending: list) -> None:
        """Reporter thread (rank 0): remember changes the server says are pending, for the next boundary."""
        with self._lock:
            for change in filter(None, map(PendingChange.from_wire, pending)):
                if change.change_id not in self._seen:
                    self._staged.setdefault(change.change_id, (change.knob, change.value, change.reason))

    def _take_change(self) -> Agreed:
        """The newest staged change the job accepts (the server supersedes older ones); refusals are logged."""
        with self._lock:
            staged, self._staged = self._staged, {}
            self._seen.update(staged)
        for cid in sorted(staged, reverse=True):
            knob, value, reason = staged[cid]
            checked, why = self._knobs.check(knob, value)
            if why is None:
                return cid, knob, checked
            log.warning("trimtab: refused change %d (%s → %r, %s): %s", cid, knob, value, reason, why)
            if self.link is not None:
                self.link.refuse(cid, self._rank, why)
        return None

    def agree(self, boundary: int) -> tuple[list[tuple[str, Number]], Agreed]:
        """Every rank's new knob values (and ceilings) and the server change they include, identical everywhere.
        Vector layout: [change_id, knob index, value] + proposals[n] + ceilings[n], reduced with MIN."""
        names = self._knobs.names
        if not names:
            return [], None
        in_dist = distributed()
        if in_dist and not self._sync.due(boundary):
            return [], None
        inf, n = math.inf, len(names)
        change = self._take_change() if self._rank == 0 or not in_dist else None
        if self._rank == 0 or not in_dist:
            head = [float(change[0]), float(names.index(change[1])), float(change[2])] if change else [0.0] * 3
            proposals = [float(self._knobs[k].value) for k in names]
            if change:
                proposals[names.index(change[1])] = float(change[2])
        else:
            head, proposals = [inf] * 3, [inf] * n
        with self._lock:  # oom_guard may run in another thread (a generation worker)
            oom_proposal = self._oom.take_proposal()
            ceilings = [float(self._knobs[k].max) for k in names]
        if oom_proposal is not None and self._oom.knob in names:
            i = names.index(self._oom.knob)
            proposals[i] = min(proposals[i], oom_proposal)
        vector = head + proposals + ceilings
        if in_dist:
            vector = self._sync.exchange(vector)
        for i, name in enumerate(names):
            if vector[3 + n + i] < self._knobs[name].max:
                self._knobs.lower_ceiling(name, vector[3 + n + i])
        new_values = [(name, self._knobs[name].clamp(vector[3 + i])) for i, name in enumerate(names)]
        agreed = None
        if math.isfinite(vector[0]) and vector[0] > 0:
            cid, name = int(vector[0]), names[int(vector[1])]
            if dict(new_values)[name] == self._knobs[name].clamp(vector[2]):
                agreed = (cid, name, dict(new_values)[name])
            else:
                log.warning("trimtab: change %d (%s → %s) overridden by an OOM on some rank; not acknowledged",
                            cid, name, vector[2])
        ceilings = {k: self._knobs[k].max for k in names}
        if ceilings != self._declared_max and self.link is not None and self._rank == 0:
            # Tell the server the new ceiling (and value): the rebalancer must not go back above it.
            self.link.update_registration(self._declare(dict(new_values)))
        self._declared_max = ceilings
        return [(k, v) for k, v in new_values if v != self._knobs[k].value], agreed

    def apply(self, changes: list[tuple[str, Number]], agreed: Agreed, applied_at_step: int) -> None:
        """Moves each knob and hands the move to its owner: the applier that declared it, else the loop (which
        reads ``hook.knobs`` at this boundary, so the move is applied the moment it is made)."""
        self.last_changes = []
        for name, value in changes:
            cid = agreed[0] if agreed and agreed[1] == name else None
            old = self._knobs.set(name, value)
            change = KnobChange(name, old, value, applied_at_step, cid, _resolve=self._settled)
            self.last_changes.append(change)
            log.info("trimtab: %s %s → %s from step %d%s", name, old, value, applied_at_step,
                     f" (change {cid})" if cid is not None else " (after an OOM)")
            for callback in self.callbacks:
                callback(name, old, value, cid)
            applier = self._appliers.get(name)
            if applier is None:
                change.applied()
                continue
            try:
                applier.apply(change)
            except Exception as exc:  # an adapter bug must not stop training: the change is refused, loudly
                log.warning("trimtab: the applier of %s failed on %s → %s", name, old, value, exc_info=True)
                change.refused(f"{type(exc).__name__}: {exc}"[:500])

    def _settled(self, change: KnobChange) -> None:
        """The knob's owner answered (any thread): acknowledge, or put the old value back and say why not."""
        if change.status == APPLIED:
            if change.change_id is not None and self.link is not None:
                self.link.ack(change.change_id, change.applied_at_step, self._rank)
            return
        with self._lock:
            if self._knobs[change.knob].value == change.new:
                self._knobs.set(change.knob, change.old)
        log.warning("trimtab: %s → %s refused by its owner (%s); %s stays %s", change.knob, change.new,
                    change.reason, change.knob, change.old)
        if change.change_id is not None and self.link is not None:
            self.link.refuse(change.change_id, self._rank, change.reason or "refused")
