"""One process's line to the trimtab server in verl's fully-async run (:mod:`.verl_async`): its step reports as
its rank, and the pending changes of the knobs it owns, staged by the reporter thread until verl's event loop
reaches the point where that process applies them (taken once, or put back when the other process must move
first)."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Optional


class _Channel:
    """One process's line to the server: its step reports (as ``rank``), and the pending changes of ``owned``."""

    def __init__(self, options: dict, rank: int, owned: tuple[str, ...], registration: Optional[dict]):
        from trimtab.trainer.server_link import Reporter

        self.job, self.rank, self.owned = options["job"], rank, owned
        self._pid, self._hostname = os.getpid(), socket.gethostname()  # once: a report is made every step
        self._lock = threading.Lock()
        self._staged: dict[int, tuple[str, Any]] = {}
        self._seen: set[int] = set()
        self.reporter = Reporter(options["server"], options["job"], options["token"], registration=registration,
                                 on_pending=self._stage if owned else None)

    def _stage(self, pending: list) -> None:  # reporter thread
        from trimtab.contract.knobs import PendingChange

        with self._lock:
            for change in filter(None, map(PendingChange.from_wire, pending)):
                if change.knob in self.owned and change.change_id not in self._seen:
                    self._staged.setdefault(change.change_id, (change.knob, change.value))

    def take(self, knob: str) -> Optional[tuple[int, Any]]:
        """The newest staged change of ``knob`` (the server supersedes older ones), once."""
        with self._lock:
            mine = {cid: value for cid, (k, value) in self._staged.items() if k == knob}
            for cid in mine:
                del self._staged[cid]
            self._seen.update(mine)
        return max(mine.items()) if mine else None

    def put_back(self, knob: str, cid: int, value: Any) -> None:
        """A change its owner cannot apply yet (the other process first): staged again for the next point."""
        with self._lock:
            self._staged.setdefault(cid, (knob, value))

    def report(self, record: Any) -> None:
        from trimtab.trainer.adapters.verl import step_to_report

        self.reporter.submit(step_to_report(record, rank=self.rank, hostname=self._hostname, pid=self._pid).to_wire())

    def close(self) -> None:
        self.reporter.close()
