"""A step's report on its way out of the job: built at the step boundary from what was measured (phases, the
allocator, the latency probe, an OOM, the framework's own figures), attributed to its GPU and component, held
until its step's CUDA events completed (queried, never waited for on the hot path), then handed to the server
link in step order. Apart from the hook because holding reports for their GPU time is a queue of its own: a
report waits at most ``GPU_WAIT_STEPS`` boundaries, so a stream that never drains cannot hold the job's reports
back."""

from __future__ import annotations

import os
import socket
from collections import deque
from typing import Mapping, Optional

import torch

from trimtab.contract.step_report import FRAMEWORK_FIELDS
from trimtab.trainer.dist import LatencyProbe
from trimtab.trainer.memory import MemorySampler
from trimtab.trainer.oom import OomHandler
from trimtab.trainer.server_link import Reporter
from trimtab.trainer.step_record import StepReport
from trimtab.trainer.timing import PhaseTimer, cuda_in_use

# A report waits at most this many step boundaries for its step's CUDA events (one or two in a loop that syncs every
# step); past that it goes without GPU time, so a stream that never drains cannot hold the job's reports back.
GPU_WAIT_STEPS = 4


class Outbox:
    """One rank's step reports: ``report`` builds and queues one per boundary, ``send_held`` sends the held ones
    whose GPU time is known. ``link`` is the server link (None: standalone, reports are only kept locally)."""

    def __init__(self, timer: PhaseTimer, probe: LatencyProbe, oom: OomHandler, *, rank: int,
                 device_map: Mapping[str, list[int]], local_gpu: Optional[int], memory_every_s: float):
        self._timer, self._probe, self._oom, self._rank, self._device_map = timer, probe, oom, rank, device_map
        self._held: deque[tuple[int, StepReport]] = deque()  # (boundary, report) waiting for its GPU time
        self._memory = MemorySampler(memory_every_s)
        self._memory.since_now()  # the memory reported is this loop's, from attach on
        self._pid, self.hostname = os.getpid(), socket.gethostname()
        self._fallback_gpu = self._gpu_without_cuda(local_gpu)
        self.link: Optional[Reporter] = None
        self.last_report: Optional[StepReport] = None

    def report(self, step: int, boundary: int, step_time_s: float, phases: dict, samples, tokens, now_s: float,
               latency_us: Optional[float], framework_memory: Optional[Mapping[str, object]] = None,
               rollout_s: Optional[tuple[Optional[float], Optional[float]]] = None,
               framework: Optional[Mapping[str, object]] = None,
               knobs: Optional[Mapping[str, float]] = None, ended_ms: Optional[int] = None,
               learning: Optional[Mapping[str, float]] = None) -> None:
        """``knobs``: the values the step ran at (the rebalancer labels the step's memory and throughput by them);
        ``ended_ms``: when the step ended by the wall clock (the server files a late report at it); ``learning``:
        the step's learning signals by trimtab's names."""
        memory = self._memory.maybe_sample(now_s)
        if framework_memory:
            memory = {**(memory or {}), **{k: v for k, v in framework_memory.items() if v is not None}}
        oom_report = self._oom.take_report()
        if oom_report is not None:
            memory = dict(memory or {})
            memory["num_ooms"] = max(memory.get("num_ooms") or 0, self._oom.ooms)
        gpu = torch.cuda.current_device() if cuda_in_use() else self._fallback_gpu
        report = StepReport(
            step=step, rank=self._rank, step_time_s=step_time_s, phases_s=phases, samples=samples, tokens=tokens,
            pid=self._pid, hostname=self.hostname, local_gpu=gpu, memory=memory,
            collective_latency_us=latency_us, component=self._component(gpu),
            collective_baseline_us=self._probe.baseline_us,
            oom=oom_report, rollout_slowest_s=(rollout_s or (None, None))[0],
            rollout_mean_s=(rollout_s or (None, None))[1], knobs=dict(knobs) if knobs else None, ended_ms=ended_ms,
            learning=dict(learning) if learning else None,
            **{k: v for k, v in (framework or {}).items() if k in FRAMEWORK_FIELDS})
        self.last_report = report
        if self._timer.pending(step) or self._held:  # its GPU time is still to come (or an earlier report's is)
            self._held.append((boundary, report))
        elif self.link is not None:
            self.link.submit(report.to_wire())
        self.send_held(boundary)

    def send_held(self, boundary: int, wait: bool = False, give_up: bool = False) -> None:
        """Sends the held reports, in step order, whose step's CUDA events completed (``resolve`` only queries
        them: no sync), or that waited ``GPU_WAIT_STEPS`` boundaries (then without GPU time). ``wait``: wait for
        the GPU (at close); ``give_up``: send everything as it is."""
        if not self._held:
            return
        resolved = {} if give_up else self._timer.resolve(wait)
        for _, report in self._held:
            if report.step in resolved:
                report.gpu_phases_s = resolved[report.step]
        while self._held:
            held_at, report = self._held[0]
            if self._timer.pending(report.step):
                if not give_up and boundary - held_at < GPU_WAIT_STEPS:
                    break
                self._timer.forget(report.step)
            self._held.popleft()
            if self.link is not None:
                self.link.submit(report.to_wire())

    def _gpu_without_cuda(self, local_gpu: Optional[int]) -> Optional[int]:
        """The local GPU when CUDA is not in use in this process: given, else LOCAL_RANK if the device map has
        it, else the device map's only GPU."""
        if local_gpu is not None:
            return int(local_gpu)
        gpus = {g for ids in self._device_map.values() for g in ids}
        local_rank = os.environ.get("LOCAL_RANK", "")
        if local_rank.isdigit() and int(local_rank) in gpus:
            return int(local_rank)
        return next(iter(gpus)) if len(gpus) == 1 else None

    def _component(self, gpu: Optional[int]) -> Optional[str]:
        """Every component the device map puts on ``gpu`` ("actor+ref" for a shared GPU)."""
        names = sorted(c for c, ids in self._device_map.items() if gpu is not None and gpu in ids)
        return "+".join(names) or None
