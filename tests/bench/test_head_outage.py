"""``bench/head_outage.py`` must notice an outage that did not hold: on 2026-12-06 a "600 s" outage ended after 4 s
(the kernel sends SIGCONT to the stopped processes of a process group that becomes orphaned, here when the shell
that started the bench exited) and the run still printed 14 000 of 14 000 stored, 0 bytes spooled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))  # head_outage.py imports its neighbours as a script does

from bench.head_outage import Peaks  # noqa: E402


def _wait_status(pid: int, stopped: bool) -> None:
    deadline = time.monotonic() + 10
    while (psutil.Process(pid).status() == psutil.STATUS_STOPPED) != stopped:
        assert time.monotonic() < deadline, f"pid {pid} never {'stopped' if stopped else 'ran'}"
        time.sleep(0.01)


def test_a_server_woken_during_the_outage_is_counted(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peaks = Peaks(tmp_path, proc.pid)
        peaks.sample()  # not watching: a running server before the outage counts for nothing
        os.kill(proc.pid, signal.SIGSTOP)
        _wait_status(proc.pid, stopped=True)
        peaks.watching = True
        peaks.sample()
        assert peaks.server_running_samples == 0
        os.kill(proc.pid, signal.SIGCONT)  # a SIGCONT the bench did not send
        _wait_status(proc.pid, stopped=False)
        peaks.sample()
        assert peaks.server_running_samples == 1
    finally:
        proc.kill()
        proc.wait()
