"""The rebalancer's queue of jobs waiting for a plan: in the order they asked, each at most once, so a burst of
reports from one job costs one plan (:mod:`trimtab.control.service` takes from it on its own thread)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

from trimtab.store.jobs import StoredJob


class PlanQueue:
    """Jobs waiting for a plan, in the order they asked, each at most once: a job queued again before its plan
    ran keeps its place (with the newest copy of the job, and ``forced`` if either asked for it)."""

    def __init__(self) -> None:
        self._jobs: "OrderedDict[str, tuple[StoredJob, bool]]" = OrderedDict()
        self._cond = threading.Condition()
        self._taken = False  # a job taken and not yet done

    def put(self, job: StoredJob, forced: bool = False) -> None:
        with self._cond:
            queued = self._jobs.get(job.name)
            self._jobs[job.name] = (job, forced or (queued is not None and queued[1]))
            if queued is None:
                self._cond.notify()

    def take(self, timeout_s: float) -> Optional[tuple[StoredJob, bool]]:
        """The job that asked first and whether it was forced, or None once ``timeout_s`` passed (or on wake)."""
        with self._cond:
            if not self._jobs:
                self._cond.wait(timeout_s)
            if not self._jobs:
                return None
            self._taken = True
            return self._jobs.popitem(last=False)[1]

    def done(self) -> None:
        with self._cond:
            self._taken = False
            self._cond.notify_all()

    def wait_empty(self, timeout_s: float) -> bool:
        """Until nothing is queued or being planned; False if ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._taken, timeout_s)

    def wake(self, drop: bool = False) -> None:
        with self._cond:
            if drop:
                self._jobs.clear()
            self._cond.notify_all()

    def names(self) -> list[str]:
        with self._cond:
            return list(self._jobs)
