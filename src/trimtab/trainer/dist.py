"""What the hook needs from torch.distributed: who we are, agreeing on knob values, and the latency probe.

Knob agreement: every ``every_steps`` step boundaries (default: every step) each rank contributes one small
float64 vector to an ``all_reduce(MIN)`` on a **gloo** group (the default group when the job already uses gloo,
otherwise one extra gloo group over the same rendezvous store, created once). Rank 0 puts the change it staged
and its knob values; other ranks put +inf there, except where an OOM made them propose a smaller batch; every
rank puts its own ceilings. MIN then gives every rank the same answer: rank 0's values, lowered by any rank's OOM.
One collective both broadcasts and merges, and the result is known to all ranks at the same boundary, so the
new values take effect at the same step everywhere with no apply step to agree on in advance.

Cost: a 3 + 2·n_knobs element float64 tensor (72 bytes for three knobs) on CPU over gloo. Measured on a loaded
2-core VM with two ranks on loopback and nothing else in the step: 0.4 ms median ``step_end`` (9.6 µs with one
rank); a real node should do better, and against RL steps of 0.1–100 s it is ≤ 0.4 % even at 0.1 s. Keeping it
on CPU matters more than its size: a tensor on the NCCL device would have to come back with ``.tolist()``, which
synchronises the host with the GPU every step. The collective also acts as a barrier, which costs nothing extra
in a job whose ranks already meet in the gradient all-reduce every step. ``every_steps=K`` trades latency of a
change (up to K steps) for 1/K of that cost.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist

from trimtab.trainer.timing import cuda_in_use


def rank_and_world() -> tuple[int, int, bool]:
    """(rank, world size, torch.distributed initialised): from torch.distributed, else RANK/WORLD_SIZE, else 0/1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), False
    except ValueError:
        return 0, 1, False


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class KnobSync:
    """``exchange(vector)`` → the element-wise MIN over all ranks, on a CPU (gloo) group."""

    def __init__(self, every_steps: int = 1):
        if every_steps < 1:
            raise ValueError("knob_sync_every must be ≥ 1")
        self.every_steps = every_steps
        self._group = None
        self._ready = False

    def due(self, boundary_index: int) -> bool:
        return (boundary_index + 1) % self.every_steps == 0

    def exchange(self, vector: list[float]) -> list[float]:
        if not self._ready:
            # Collective: every rank reaches its first boundary, so every rank creates the group here.
            if "gloo" not in str(dist.get_backend()):  # "gloo", or "cpu:gloo,cuda:nccl": CPU tensors work
                self._group = dist.new_group(backend="gloo")
            self._ready = True
        t = torch.tensor(vector, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
        return t.tolist()


class LatencyProbe:
    """A small all-reduce (``n_floats`` float32) on the job's own group every ``every_steps`` boundaries.

    On gloo/CPU it is timed with ``perf_counter``; on CUDA (NCCL) with an event pair resolved later by
    ``query()``, since a host clock around an asynchronous collective would only measure the launch. A first,
    untimed all-reduce lines the ranks up, so the timed one measures the fabric rather than rank skew. The
    baseline is the median of the first ``baseline_n`` probes: "slow" is relative to this job on this fabric.
    """

    def __init__(self, every_steps: int = 0, baseline_n: int = 5, n_floats: int = 8):
        self.every_steps, self.baseline_n, self.n_floats = every_steps, baseline_n, n_floats
        self._first: list[float] = []
        self.baseline_us: Optional[float] = None
        self.last_us: Optional[float] = None
        self._pending: list = []

    def due(self, boundary_index: int) -> bool:
        return self.every_steps > 0 and (boundary_index + 1) % self.every_steps == 0 and distributed()

    def probe(self) -> Optional[float]:
        """Runs one probe (collective: every rank calls it at the same boundary); returns µs if known now."""
        on_cuda = "nccl" in str(dist.get_backend()) and cuda_in_use()
        device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
        t = torch.zeros(self.n_floats, device=device)
        dist.all_reduce(t)  # line the ranks up
        if on_cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
            dist.all_reduce(t)
            ev1.record()
            self._pending.append((ev0, ev1))
            return None
        t0 = time.perf_counter()
        dist.all_reduce(t)
        return self._record((time.perf_counter() - t0) * 1e6)

    def resolve(self) -> Optional[float]:
        """The newest CUDA probe that completed since the last call, in µs (never blocks)."""
        latest = None
        while self._pending and self._pending[0][1].query():
            ev0, ev1 = self._pending.pop(0)
            latest = self._record(ev0.elapsed_time(ev1) * 1000.0)
        return latest

    def _record(self, us: float) -> float:
        self.last_us = us
        if self.baseline_us is None:
            self._first.append(us)
            if len(self._first) >= self.baseline_n:
                self.baseline_us = statistics.median(self._first)
        return us
