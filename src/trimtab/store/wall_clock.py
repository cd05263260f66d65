"""The daemon's wall clock in epoch ms: the stamp of the rows its API and its planner write (a job's registration,
a report's arrival, a change queued or acknowledged, a decision, a plan's status).

Its own module because both the jobs' and the knob changes' modules stamp rows with it and neither should import
the other for a clock; a test pins a module's time by patching the ``now_ms`` that module imported.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
