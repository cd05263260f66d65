"""The thread that reads per-process utilization off the tick: every ``every_s``, one read per GPU
(``ProcessActivity.read``); the tick only takes what was added up when it makes process rows.

Why a thread: the read cost 2.7–2.9 ms per GPU on an H100 (driver 580), so on the tick it made the tick 7.1× as
long. A ctypes call into NVML releases the GIL, so the tick runs while the thread waits on the driver.

Why ``ACTIVITY_EVERY_S`` = 1 s: each record is an average over the time since the previous read, and 1 s reads are
the cadence the H100 check of that reading was made at (bench/process_activity.py; ``--activity-every`` runs it at
another). A read costs one call per GPU: at 2.8 ms, 0.28 % of a core per GPU.

A lost GPU leaves the others read; any other surprise is said once and the thread goes on.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from trimtab.agent.nvml.calls import GpuLost, NvmlCalls

ACTIVITY_EVERY_S = 1.0


class ActivityReader:
    """Reads each GPU's ``activity`` (those that have one) every ``every_s`` on its own thread (``None``: no
    thread; call :meth:`read` yourself)."""

    def __init__(self, calls: NvmlCalls, gpus: Sequence[Any], every_s: Optional[float] = ACTIVITY_EVERY_S):
        if every_s is not None and not every_s > 0:
            raise ValueError(f"the per-process utilization cadence must be a positive number of seconds, not "
                             f"{every_s!r}")
        self.calls, self.gpus, self.every_s = calls, gpus, every_s
        self.reads = 0  # rounds over the GPUs done
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self.every_s is not None and any(g.activity is not None for g in self.gpus):
            self._thread = threading.Thread(target=self._loop, name="trimtab-nvml-activity", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(self.every_s)

    def read(self) -> None:
        """One read of every GPU still sampled."""
        for gpu in self.gpus:
            if gpu.lost or gpu.activity is None or self._stop.is_set():
                continue
            try:
                gpu.activity.read()
            except GpuLost:
                continue  # retired, with its event; the others go on
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any surprise; say so once
                self.calls.report_once(gpu, "process_utilization_reader", type(exc).__name__, exc)
        self.reads += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
