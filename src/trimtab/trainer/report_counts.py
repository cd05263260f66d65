"""The exact count of what became of every step report a reporter was handed, kept so that
``submitted + inherited == sent + rejected + dropped + unconfirmed + pending + left`` at every moment:

* ``submitted``: reports the job handed over; ``inherited``: reports an earlier process of this job and rank left
  on disk, picked up at start (sent first, in order);

* ``sent``: the server confirmed them (``stored`` new by that answer, ``already_stored``: it had them — a POST whose
  answer was lost, resent); ``late``: of those, the ones that waited out an outage (resent after a failed POST, or
  read back from disk);
* ``rejected``: the server refused them (422);
* ``dropped``: lost without the server ever having them, by reason (``dropped_by``: ``queue_full`` — no spool, or
  it could not keep up —, ``spool_full``, ``disk_error``, ``closed`` while some were still waiting);
* ``unconfirmed``: lost after a POST that got no answer (a timeout, a 5xx): the server may have stored them;
* ``pending``: still to send (memory, disk, in flight: the backlog's own figure, :mod:`trimtab.trainer.backlog`);
* ``left``: still unsent at ``close``, left on disk for the next process of this job and rank (with no spool, or a
  disk that refuses them, they are ``dropped``, ``closed``).

Besides: ``spooled``, reports written to the disk spool; ``spool_errors``, the disk errors that made the backlog
give its spool up for a while. The counters are plain numbers: the backlog changes them under its own lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUEUE_FULL, SPOOL_FULL, DISK_ERROR, CLOSED = "queue_full", "spool_full", "disk_error", "closed"  # why dropped


@dataclass
class ReportCounts:
    """The counters of one reporter's reports (the module says what each one counts)."""

    submitted: int = 0
    inherited: int = 0
    left: int = 0
    sent: int = 0
    stored: int = 0
    already_stored: int = 0
    late: int = 0
    rejected: int = 0
    unconfirmed: int = 0
    spooled: int = 0
    spool_errors: int = 0
    dropped_by: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by.values())

    def lost(self, reports: int, in_doubt: int, reason: str) -> None:
        """``reports`` are lost, ``in_doubt`` of them after a POST that got no answer (unconfirmed), the others for
        ``reason`` (dropped)."""
        self.unconfirmed += in_doubt
        if reports - in_doubt:
            self.dropped_by[reason] = self.dropped_by.get(reason, 0) + reports - in_doubt
