"""Waiting on a thing with a deadline, never for a fixed time: a loaded 2-core CI runs everything slower, so a
test waits until what it needs is there (and fails, saying what it waited for, when it is not by the deadline)."""

from __future__ import annotations

import time


def eventually(check, timeout_s: float = 10.0, interval_s: float = 0.05):
    """``check()``'s first truthy result within ``timeout_s`` (the reporter posts from its own thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            assert result, f"not true within {timeout_s} s"
            return result
        time.sleep(interval_s)
