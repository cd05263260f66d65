"""The words the daemon answers with, defined once: a grade's status (a rule's row, a GPU, a node, a job), a knob
change's status and a decision's outcome. They cross the API (``/v1/balance``, ``/v1/jobs``, ``/metrics``), the
store's ``knob_changes`` and ``decisions`` columns and the job's side of a knob change (``trimtab.trainer.apply``),
so every side imports them from here; stdlib only.
"""

from __future__ import annotations

__all__ = ["ACT", "ADVISED", "APPLIED", "CANCELLED", "CHANGE_STATUSES", "DECISION_OUTCOMES", "GRADES", "KEPT",
           "NO_DATA", "OK", "PENDING", "REFUSED", "ROLLED_BACK", "SETTLED_CHANGES", "SETTLED_DECISIONS", "SEVERITY",
           "SUPERSEDED", "UNSUPPORTED", "WATCH"]

# A grade: how a rule's reading stands against its lines (ok < watch < act); no_data and unsupported weigh as ok.
OK, WATCH, ACT, NO_DATA, UNSUPPORTED = "ok", "watch", "act", "no_data", "unsupported"
GRADES = (OK, WATCH, ACT, NO_DATA, UNSUPPORTED)
SEVERITY = {OK: 0, NO_DATA: 0, UNSUPPORTED: 0, WATCH: 1, ACT: 2}

# A knob change's status: queued (pending) until the job applies or refuses it, or a newer change or the job's end
# replaces it (superseded, cancelled).
PENDING, APPLIED, REFUSED, SUPERSEDED, CANCELLED = "pending", "applied", "refused", "superseded", "cancelled"
CHANGE_STATUSES = (PENDING, APPLIED, REFUSED, SUPERSEDED, CANCELLED)
SETTLED_CHANGES = (APPLIED, SUPERSEDED, CANCELLED)

# A decision's outcome: pending while its change is measured, then kept or rolled back; advised where the job is
# in advise mode (nothing applied); refused, superseded or cancelled as its change was.
ADVISED, KEPT, ROLLED_BACK = "advised", "kept", "rolled_back"
DECISION_OUTCOMES = (PENDING, ADVISED, KEPT, ROLLED_BACK, REFUSED, SUPERSEDED, CANCELLED)
SETTLED_DECISIONS = (ADVISED, KEPT, ROLLED_BACK, REFUSED, SUPERSEDED, CANCELLED)
