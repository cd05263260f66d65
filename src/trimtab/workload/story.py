"""The closed loop, end to end: a real `trimtab up` daemon, the reference pipeline started from deliberately bad
defaults, the rebalancer in ``auto``, and static settings measured in the same process for comparison.

`trimtab demo` (CPU, tiny config) and ``bench/rebalance.py`` (the H200 benchmark) both run this; only sizes and
what they print differ. Throughput figures are samples over wall time of whole steps; "steps to within 5 %" is the
first step from which a rolling 3-step throughput reaches 95 % of the reference.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .config import DEFAULT_KNOBS, Knobs, PipelineConfig
from .loop import Pipeline, StepRecord

API_LINE = re.compile(r"API on (http://[^\s]+?) ")


@dataclass
class Daemon:
    proc: subprocess.Popen
    url: str
    token: str
    state_dir: Path
    log_path: Path

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self, keep_state: bool = False) -> None:
        """Stop the daemon and remove its state directory (store, token, log) unless ``keep_state``: a run leaves
        nothing in the temporary directory."""
        self.stop()
        if not keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def start_daemon(state_dir: Optional[Path] = None, args: Sequence[str] = (), timeout_s: float = 90.0) -> Daemon:
    """`trimtab up` on a free loopback port with its own state directory (SQLite store, admin token)."""
    state_dir = Path(state_dir or tempfile.mkdtemp(prefix="trimtab-demo-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "daemon.log"
    env = {**os.environ, "TRIMTAB_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1"}
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "trimtab.cli.main", "up", "--host", "127.0.0.1", "--port", "0",
                             *args], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = API_LINE.search(log_path.read_text())
        token_path = state_dir / "admin.token"
        if match and token_path.exists():
            return Daemon(proc, match.group(1), token_path.read_text().strip(), state_dir, log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"trimtab up did not start (exit {proc.poll()}): {log_path.read_text()[-2000:]}")


def throughput(records: Sequence[StepRecord]) -> Optional[float]:
    seconds = sum(r.step_s for r in records)
    return sum(r.samples for r in records) / seconds if records and seconds > 0 else None


def steps_to_within(records: Sequence[StepRecord], reference: float, fraction: float = 0.95,
                    smooth: int = 3) -> Optional[int]:
    """Index (0-based step count) of the first step from which a rolling ``smooth``-step throughput is at least
    ``fraction`` × ``reference``; None if never."""
    for end in range(smooth, len(records) + 1):
        tp = throughput(records[end - smooth:end])
        if tp is not None and tp >= fraction * reference:
            return end - 1
    return None


def measure_static(pipeline: Pipeline, knobs: dict, warmup: int, steps: int,
                   show: Optional[Callable[[StepRecord], None]] = None) -> tuple[float, list[StepRecord]]:
    """Throughput of fixed knobs: restart the workers (nothing generated under other knobs counts), ``warmup``
    unmeasured steps, then ``steps`` measured ones."""
    pipeline.hook = None
    pipeline.knobs = dict(knobs)
    pipeline.restart_workers()
    if warmup:
        pipeline.run(warmup)
    records = pipeline.run(steps, show)
    return throughput(records) or 0.0, records


@dataclass
class AutoRun:
    records: list[StepRecord] = field(default_factory=list)
    acks: list[dict] = field(default_factory=list)
    stopped_because: str = ""


def run_auto(pipeline: Pipeline, hook, max_steps: int, budget_s: float, tail_steps: int,
             show: Optional[Callable[[StepRecord], None]] = None, settled: Optional[Callable[[], bool]] = None,
             poll_s: float = 1.0, min_steps: int = 0) -> AutoRun:
    """Run under the hook (mode auto) from the pipeline's current knobs until ``max_steps`` or ``budget_s``, or until
    ``settled()`` (the rebalancer has nothing in flight and no rule fires) held for ``tail_steps`` steps in a row —
    those last steps are then the settled throughput. ``budget_s`` ends no run before ``min_steps`` steps: a budget
    in seconds is a different run on a slower host (H200 runs 24–26: batch-1 steps of 48–56 s, not 38, left 11–24
    steps in 240 s instead of 60–90, and the controller's climb went on in the blocks after the run).
    ``settled`` is asked at most every ``poll_s`` seconds (its answer stands for the steps in between; the run ends
    only on a fresh one: on 0.1 s steps a second-old "settled" ended `trimtab demo`'s run with a change just
    queued), and the asking and ``show`` are off the job's clock (``Pipeline.off_the_clock``): the benchmark's own
    bookkeeping is not the job's step time — on 50 ms steps a ``GET /healthz`` after each one read as a 40 % slower
    job, and its reports told the rebalancer so."""
    pipeline.hook = hook
    pipeline.knobs = hook.knobs
    pipeline.restart_workers()
    out = AutoRun()
    started = time.monotonic()
    quiet = 0
    asked_at, is_settled = None, False
    pipeline._boundary_s = None
    while len(out.records) < max_steps:
        record = pipeline.step()
        out.records.append(record)
        with pipeline.off_the_clock():
            if show is not None:
                show(record)
            if settled is not None and (asked_at is None or time.monotonic() - asked_at >= poll_s):
                asked_at, is_settled = time.monotonic(), settled()
        quiet = quiet + 1 if is_settled else 0
        if quiet >= tail_steps:
            with pipeline.off_the_clock():  # an answer up to poll_s old must not end the run: ask once more
                asked_at, is_settled = time.monotonic(), settled()
            if is_settled:
                out.stopped_because = f"settled: {tail_steps} steps in a row with nothing to change"
                break
            quiet = 0
        if time.monotonic() - started > budget_s and len(out.records) >= min_steps:
            out.stopped_because = f"time budget {budget_s:.0f} s" + (f" (after at least {min_steps} steps)"
                                                                     if min_steps else "")
            break
    else:
        out.stopped_because = f"{max_steps} steps"
    return out


def api_get(daemon: Daemon, path: str) -> Any:
    return _api(daemon, "GET", path)


def _api(daemon: Daemon, method: str, path: str, body: Optional[dict] = None) -> Any:
    import httpx

    response = httpx.request(method, daemon.url + path, json=body, timeout=10.0,
                             headers={"Authorization": f"Bearer {daemon.token}"})
    response.raise_for_status()
    return response.json()


class RebalancerIdle:
    """A ``settled`` test: the job's last decision is closed and no rule fired since (the rebalancer's note says
    "no rule fires", or a rule fires that has no action left or was advised before). ``note`` is the last note
    read."""

    def __init__(self, daemon: Daemon, job: str):
        self.daemon, self.job, self.note = daemon, job, ""

    def __call__(self) -> bool:
        try:
            health = api_get(self.daemon, "/healthz")
        except Exception:
            return False
        self.note = (health.get("components", {}).get("rebalancer", {}).get("jobs", {}) or {}).get(self.job, "")
        note = self.note
        return note.startswith("no rule fires") or "advised before" in note or "fires, no action" in note


rebalancer_idle = RebalancerIdle


def hold(daemon: Daemon, job: str, pipeline: Pipeline, steps: int,
         show: Optional[Callable[[StepRecord], None]] = None) -> list[StepRecord]:
    """Switch the job to mode ``advise`` and run ``steps`` steps: the rebalancer finishes a change in flight (keeps
    it or rolls it back) and starts none, so these steps measure the settings it left."""
    _api(daemon, "PUT", f"/v1/jobs/{job}/mode", {"mode": "advise"})
    return pipeline.run(steps, show)


def default_knobs() -> dict:
    return dict(DEFAULT_KNOBS)


def knob_tuple(record: StepRecord) -> tuple[int, int, int]:
    return (record.batch_size, record.prefetch, record.sync_every)


def declaration(start: dict, config: PipelineConfig) -> dict[str, tuple[int, int, int]]:
    from .cli import knob_declaration

    return knob_declaration(Knobs.read(start), config.samples_per_step)
