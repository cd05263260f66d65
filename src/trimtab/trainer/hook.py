"""The training-loop hook: times a job's phases, reports each step to the trimtab server from a background thread,
and applies the rebalancer's knob changes at step boundaries, identically on every rank.

    hook = trimtab.trainer.attach(job="ppo-demo", server="http://127.0.0.1:9460", token=...,
                                  device_map={"actor": [0, 1], "critic": [2]},
                                  knobs={"batch_size": (8, 1, 64), "prefetch": (0, 0, 4)})
    for step in range(n):
        bs = hook.knobs["batch_size"]
        with hook.oom_guard():
            with hook.phase("generation"): ...
        if hook.last_oom:                      # the step was lost; batch_size is halved from the next step
            hook.step_end(samples=0); continue
        with hook.phase("update"): ...
        hook.step_end(samples=bs, tokens=t)

The training thread never waits on the network: ``step_end`` queues the report and returns (tens of µs); only the
knob agreement between ranks (one tiny gloo all-reduce, see ``dist.py``) and an optional latency probe are
collectives, and every rank runs them at the same boundary. Import needs torch and httpx only.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import socket
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import httpx
import torch

from trimtab.contract.knobs import MAX_JOB_NAME, MAX_NAME, MODES as SERVER_MODES, NAME_PATTERN, PendingChange
from trimtab.contract.roles import RolePlacement
from trimtab.contract.step_report import FRAMEWORK_FIELDS
from trimtab.trainer.apply import APPLIED, KnobApplier, KnobChange
from trimtab.trainer.dist import KnobSync, LatencyProbe, distributed, rank_and_world
from trimtab.trainer.knobs import KnobSet, KnobSpecLike, Number
from trimtab.trainer.memory import MemorySampler, is_oom
from trimtab.trainer.step_record import StepReport
from trimtab.trainer.server_link import Reporter
from trimtab.trainer.timing import Phase, PhaseTimer, cuda_in_use

log = logging.getLogger("trimtab.trainer")
# The API's names: one it would refuse is refused here, at attach, rather than by a 422 on every retry.
SLUG = re.compile(NAME_PATTERN)
MODES = (None, *SERVER_MODES)  # None: keep the mode the server has
ChangeCallback = Callable[[str, Number, Number, Optional[int]], None]
# A report waits at most this many step boundaries for its step's CUDA events (one or two in a loop that syncs every
# step); past that it goes without GPU time, so a stream that never drains cannot hold the job's reports back.
GPU_WAIT_STEPS = 4


@dataclass(frozen=True)
class OomEvent:
    """An out-of-memory error ``oom_guard`` caught: the step it lost and what the batch size becomes."""

    step: int
    batch_size: Optional[Number]
    new_batch_size: Optional[Number]
    error: str


class _OomGuard:
    __slots__ = ("_hook",)

    def __init__(self, hook: "Hook"):
        self._hook = hook

    def __enter__(self) -> "_OomGuard":
        self._hook.last_oom = None
        return self

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is None or not is_oom(exc):
            return False
        # The traceback's finished frames hold the tensors of the failed attempt: free them before emptying the
        # cache, or empty_cache() cannot give their blocks back.
        traceback.clear_frames(tb)
        self._hook._handle_oom(exc)
        return True


class Hook:
    """See the module docstring; build one with :func:`attach` on every rank.

    Options: ``device_map`` component → local GPU indices (attribution); ``knobs`` name → (start, min, max);
    ``mode`` auto/advise/off at registration (None keeps the server's); ``probe_every`` steps between latency
    probes (0: off) and ``probe_baseline_n`` probes in the baseline; ``memory_every_s`` between allocator reads;
    ``knob_sync_every`` steps between knob agreements (see ``dist.py``); ``local_gpu`` where CUDA is not in use
    in this process; ``oom_knob`` the knob ``oom_guard`` halves; ``cuda_events`` off to skip event records;
    ``queue_max`` reports kept while the server is away; ``timeout_s`` per HTTP request (≤ 1 s keeps a dying
    server from holding the reporter); ``backoff_max_s`` between retries; ``transport`` an httpx transport (tests);
    ``appliers`` knob → the :class:`~trimtab.trainer.apply.KnobApplier` that owns it (a framework adapter): a
    change of such a knob is acknowledged only once that applier says it took effect, and refused when it cannot
    apply it. Knobs without an applier are owned by the loop that reads ``hook.knobs``; ``advise_only_reason``
    says why a job declares no knobs (its framework cannot change them between steps), for ``trimtab check``;
    ``roles`` where each role runs (:class:`~trimtab.contract.roles.RolePlacement`, found by a framework adapter),
    registered beside the device map (their nodes join the job's hostnames).
    """

    def __init__(self, job: str, server: Optional[str] = None, token: Optional[str] = None, *,
                 device_map: Optional[Mapping[str, Sequence[int]]] = None,
                 knobs: Optional[Mapping[str, KnobSpecLike]] = None, mode: Optional[str] = None,
                 probe_every: int = 0, probe_baseline_n: int = 5, memory_every_s: float = 5.0,
                 knob_sync_every: int = 1, local_gpu: Optional[int] = None, oom_knob: str = "batch_size",
                 cuda_events: bool = True, queue_max: int = 256, timeout_s: float = 1.0,
                 backoff_max_s: float = 5.0, transport: Optional[httpx.BaseTransport] = None,
                 appliers: Optional[Mapping[str, KnobApplier]] = None,
                 advise_only_reason: Optional[str] = None, roles: Sequence[RolePlacement] = ()):
        for kind, name, limit in ([("job", job, MAX_JOB_NAME)] + [("knob", k, MAX_NAME) for k in (knobs or {})]
                                  + [("component", c, MAX_NAME) for c in (device_map or {})]):
            if not (isinstance(name, str) and len(name) <= limit and SLUG.match(name)):
                raise ValueError(f"{kind} name {name!r}: letters, digits and . _ - (≤ {limit}), starting with a "
                                 f"letter or digit")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.job, self._mode, self._advise_only_reason = job, mode, advise_only_reason
        self.rank, self.world_size, _ = rank_and_world()
        self.device_map = {str(c): [int(g) for g in gpus] for c, gpus in (device_map or {}).items()}
        self.roles = list(roles)
        self._knobs = KnobSet(knobs)
        self._appliers = dict(appliers or {})
        unknown = sorted(set(self._appliers) - set(self._knobs.names))
        if unknown:
            raise ValueError(f"appliers for undeclared knobs: {', '.join(unknown)}")
        self.last_changes: list[KnobChange] = []  # the changes of the newest boundary, with how they settled
        self._declared_max = {k: self._knobs[k].max for k in self._knobs.names}  # as the server knows them
        self._oom_knob = oom_knob
        self._timer = PhaseTimer(cuda_events)
        self._held: deque[tuple[int, StepReport]] = deque()  # (boundary, report) waiting for its GPU time
        self._memory = MemorySampler(memory_every_s)
        self._memory.since_now()  # the memory reported is this loop's, from attach on
        self._sync = KnobSync(knob_sync_every)
        self._probe = LatencyProbe(probe_every, probe_baseline_n)
        self._pid, self._hostname = os.getpid(), socket.gethostname()
        self._fallback_gpu = self._gpu_without_cuda(local_gpu)
        self._step, self._boundaries = 0, 0
        self._t_attach_s = time.perf_counter()
        self._step_start_s: Optional[float] = None
        self._lock = threading.Lock()
        self._staged: dict[int, tuple] = {}  # change_id → (knob, value, reason), from the reporter thread
        self._seen: set[int] = set()  # change ids applied or refused: never again
        self._callbacks: list[ChangeCallback] = []
        self._oom_proposal: Optional[float] = None
        self._oom_report: Optional[dict] = None
        self._said: set[str] = set()
        self.ooms = 0
        self.last_oom: Optional[OomEvent] = None
        self.last_report: Optional[StepReport] = None
        self._closed = False
        self._reporter: Optional[Reporter] = None
        if server is not None:
            self._reporter = Reporter(
                server, job, token or os.environ.get("TRIMTAB_TOKEN"),
                registration=self._declaration() if self.rank == 0 else None,
                on_pending=self._stage if self.rank == 0 else None, queue_max=queue_max, timeout_s=timeout_s,
                backoff_max_s=backoff_max_s, transport=transport)
        if self.world_size > 1 and not distributed():
            log.warning("trimtab: RANK/WORLD_SIZE say %d ranks but torch.distributed is not initialised: knob "
                        "changes reach rank 0 only (attach after init_process_group)", self.world_size)
        atexit.register(self.close)

    # -- what the training loop uses ------------------------------------------------------------------------

    @property
    def knobs(self) -> Mapping[str, Number]:
        """Read-only; changes only inside ``step_end``, to the same values at the same step on every rank."""
        return self._knobs.values

    @property
    def step(self) -> int:
        """The step now running (the one the next ``step_end`` ends)."""
        return self._step

    def phase(self, name: str) -> Phase:
        """``with hook.phase("generation"):`` — generation, evaluation, communication, update, validation,
        checkpoint or wait (waiting for rollout to hand over a batch). Phases should not nest: nested time
        counts twice. "other" is accepted too, but the report's "other" is always the step's time minus the
        named phases."""
        return self._timer.phase(name)

    def step_begin(self) -> None:
        """Optional: marks where the current step starts (by default, where the previous ``step_end`` began)."""
        self._step_start_s = time.perf_counter()

    def on_change(self, callback: ChangeCallback) -> ChangeCallback:
        """``callback(knob, old, new, change_id)`` on every rank when a knob changes (change_id None: an OOM)."""
        self._callbacks.append(callback)
        return callback

    def claim_knobs(self, applier: KnobApplier) -> list[str]:
        """For a framework adapter that runs the loop itself: ``applier`` owns every declared knob that no applier
        owns yet (there is no user loop to read them). Returns those knobs' names."""
        claimed = [k for k in self._knobs.names if k not in self._appliers]
        for name in claimed:
            self._appliers[name] = applier
        return claimed

    def oom_guard(self) -> _OomGuard:
        """``with hook.oom_guard():`` catches an out-of-memory error, reports it, halves ``batch_size`` from the
        next step (within bounds, and never back up to the size that failed), empties the CUDA cache and lets
        the loop go on; ``hook.last_oom`` is set until the next guarded block. Any thread may use it (e.g. a
        generation worker). Only guard code without collectives in a multi-rank job: a rank that skips a
        collective its peers are in would hang them."""
        return _OomGuard(self)

    def step_end(self, samples: Optional[float] = None, tokens: Optional[float] = None, *,
                 step: Optional[int] = None, phases_s: Optional[Mapping[str, float]] = None,
                 step_time_s: Optional[float] = None, memory: Optional[Mapping[str, object]] = None,
                 rollout_s: Optional[tuple[Optional[float], Optional[float]]] = None,
                 framework: Optional[Mapping[str, object]] = None) -> None:
        """Ends the step: agree on knobs (every rank, same boundary), queue the report, apply changes.

        ``step``: the job's own step number (default: counted from 0). ``phases_s``: phase seconds measured
        elsewhere (a framework's timers), added to the ``phase()`` blocks. ``step_time_s``: the step's duration as
        the framework timed it (default: wall time since the last boundary). ``memory``: allocator figures the
        framework measured where the hook cannot (its workers' GPUs), merged over the hook's own. ``rollout_s``:
        (slowest, mean) sample generation time, the rollout's long tail. ``framework``: what the framework logged
        for the step: ``prompts``, ``completions``, ``completion_mean_tokens``, ``reward_mean``, ``logged``."""
        now_s = time.perf_counter()
        if step is not None:
            self._step = int(step)
        start_s = self._step_start_s
        if start_s is None:
            start_s = self._timer.first_entry_s or self._t_attach_s
        step_no = self._step
        step_time_s = max(0.0, now_s - start_s) if step_time_s is None else max(0.0, float(step_time_s))
        phases = self._timer.close_step(step_no, step_time_s, phases_s)
        changes, agreed = self._agree_knobs()
        latency_us = self._probe.probe() if self._probe.due(self._boundaries) else None
        resolved_us = self._probe.resolve()
        try:
            self._report(step_no, step_time_s, phases, samples, tokens, now_s,
                         latency_us if latency_us is not None else resolved_us, memory, rollout_s, framework)
        except Exception:  # a bug in bookkeeping must not stop training; say it once
            self._say("report", "trimtab: could not build the step report", exc_info=True)
        self._apply(changes, agreed, applied_at_step=step_no + 1)
        self._step, self._boundaries, self._step_start_s = step_no + 1, self._boundaries + 1, now_s

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued (for at most ``timeout_s``) and stops the reporter thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:  # the last steps' GPU time: waiting for the GPU is fine now, the loop is done
            self._send_held(wait=True)
        except Exception:
            self._say("gpu-close", "trimtab: could not resolve the last steps' GPU time", exc_info=True)
            self._send_held(give_up=True)
        if self._reporter is not None:
            self._reporter.close(timeout_s)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def stats(self) -> dict:
        """Counters for logs and tests: reports sent/dropped/rejected, offline, OOMs, the probe's baseline."""
        r = self._reporter
        return {"sent": r.sent if r else 0, "dropped": r.dropped if r else 0, "rejected": r.rejected if r else 0,
                "queued": r.queued if r else 0, "offline": bool(r and r.offline), "ooms": self.ooms,
                "collective_baseline_us": self._probe.baseline_us, "collective_last_us": self._probe.last_us}

    # -- knob changes -----------------------------------------------------------------------------------------

    def _stage(self, pending: list) -> None:
        """Reporter thread (rank 0): remember changes the server says are pending, for the next boundary."""
        with self._lock:
            for change in filter(None, map(PendingChange.from_wire, pending)):
                if change.change_id not in self._seen:
                    self._staged.setdefault(change.change_id, (change.knob, change.value, change.reason))

    def _take_change(self) -> Optional[tuple[int, str, Number]]:
        """The newest staged change the job accepts (the server supersedes older ones); refusals are logged."""
        with self._lock:
            staged, self._staged = self._staged, {}
            self._seen.update(staged)
        for cid in sorted(staged, reverse=True):
            knob, value, reason = staged[cid]
            checked, why = self._knobs.check(knob, value)
            if why is None:
                return cid, knob, checked
            log.warning("trimtab: refused change %d (%s → %r, %s): %s", cid, knob, value, reason, why)
            if self._reporter is not None:
                self._reporter.refuse(cid, self.rank, why)
        return None

    def _agree_knobs(self) -> tuple[list[tuple[str, Number]], Optional[tuple[int, str, Number]]]:
        """Every rank's new knob values (and ceilings) and the server change they include, identical everywhere.
        Vector layout: [change_id, knob index, value] + proposals[n] + ceilings[n], reduced with MIN."""
        names = self._knobs.names
        if not names:
            return [], None
        in_dist = distributed()
        if in_dist and not self._sync.due(self._boundaries):
            return [], None
        inf, n = math.inf, len(names)
        change = self._take_change() if self.rank == 0 or not in_dist else None
        if self.rank == 0 or not in_dist:
            head = [float(change[0]), float(names.index(change[1])), float(change[2])] if change else [0.0] * 3
            proposals = [float(self._knobs[k].value) for k in names]
            if change:
                proposals[names.index(change[1])] = float(change[2])
        else:
            head, proposals = [inf] * 3, [inf] * n
        with self._lock:  # oom_guard may run in another thread (a generation worker)
            oom_proposal, self._oom_proposal = self._oom_proposal, None
            ceilings = [float(self._knobs[k].max) for k in names]
        if oom_proposal is not None and self._oom_knob in names:
            i = names.index(self._oom_knob)
            proposals[i] = min(proposals[i], oom_proposal)
        vector = head + proposals + ceilings
        if in_dist:
            vector = self._sync.exchange(vector)
        for i, name in enumerate(names):
            if vector[3 + n + i] < self._knobs[name].max:
                self._knobs.lower_ceiling(name, vector[3 + n + i])
        new_values = [(name, self._knobs[name].clamp(vector[3 + i])) for i, name in enumerate(names)]
        agreed = None
        if math.isfinite(vector[0]) and vector[0] > 0:
            cid, name = int(vector[0]), names[int(vector[1])]
            if dict(new_values)[name] == self._knobs[name].clamp(vector[2]):
                agreed = (cid, name, dict(new_values)[name])
            else:
                log.warning("trimtab: change %d (%s → %s) overridden by an OOM on some rank; not acknowledged",
                            cid, name, vector[2])
        ceilings = {k: self._knobs[k].max for k in names}
        if ceilings != self._declared_max and self._reporter is not None and self.rank == 0:
            # Tell the server the new ceiling (and value): the rebalancer must not go back above it.
            self._reporter.update_registration(self._declaration(dict(new_values)))
        self._declared_max = ceilings
        return [(k, v) for k, v in new_values if v != self._knobs[k].value], agreed

    def _apply(self, changes: list[tuple[str, Number]], agreed: Optional[tuple[int, str, Number]],
               applied_at_step: int) -> None:
        """Moves each knob and hands the move to its owner: the applier that declared it, else the loop (which
        reads ``hook.knobs`` at this boundary, so the move is applied the moment it is made)."""
        self.last_changes = []
        for name, value in changes:
            cid = agreed[0] if agreed and agreed[1] == name else None
            old = self._knobs.set(name, value)
            change = KnobChange(name, old, value, applied_at_step, cid, _resolve=self._settled)
            self.last_changes.append(change)
            log.info("trimtab: %s %s → %s from step %d%s", name, old, value, applied_at_step,
                     f" (change {cid})" if cid is not None else " (after an OOM)")
            for callback in self._callbacks:
                callback(name, old, value, cid)
            applier = self._appliers.get(name)
            if applier is None:
                change.applied()
                continue
            try:
                applier.apply(change)
            except Exception as exc:  # an adapter bug must not stop training: the change is refused, loudly
                log.warning("trimtab: the applier of %s failed on %s → %s", name, old, value, exc_info=True)
                change.refused(f"{type(exc).__name__}: {exc}"[:500])

    def _settled(self, change: KnobChange) -> None:
        """The knob's owner answered (any thread): acknowledge, or put the old value back and say why not."""
        if change.status == APPLIED:
            if change.change_id is not None and self._reporter is not None:
                self._reporter.ack(change.change_id, change.applied_at_step, self.rank)
            return
        with self._lock:
            if self._knobs[change.knob].value == change.new:
                self._knobs.set(change.knob, change.old)
        log.warning("trimtab: %s → %s refused by its owner (%s); %s stays %s", change.knob, change.new,
                    change.reason, change.knob, change.old)
        if change.change_id is not None and self._reporter is not None:
            self._reporter.refuse(change.change_id, self.rank, change.reason or "refused")

    # -- OOM ------------------------------------------------------------------------------------------------

    def _handle_oom(self, exc: BaseException) -> None:
        failed = new = None
        with self._lock:
            self.ooms += 1
            if self._oom_knob in self._knobs:
                knob = self._knobs[self._oom_knob]
                failed = knob.value
                new = knob.clamp(failed / 2)
                self._knobs.lower_ceiling(self._oom_knob, (failed - 1) if knob.integer else new)
                self._oom_proposal = new if self._oom_proposal is None else min(self._oom_proposal, new)
            self._oom_report = {"ooms": self.ooms, "failed_batch_size": failed, "new_batch_size": new}
        self.last_oom = OomEvent(self._step, failed, new, str(exc)[:300])
        log.warning("trimtab: out of memory at step %d with %s=%s; %s from the next step (%s)", self._step,
                    self._oom_knob, failed, new, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        if cuda_in_use():
            torch.cuda.empty_cache()

    # -- reports --------------------------------------------------------------------------------------------

    def _report(self, step: int, step_time_s: float, phases: dict, samples, tokens, now_s: float,
                latency_us: Optional[float], framework_memory: Optional[Mapping[str, object]] = None,
                rollout_s: Optional[tuple[Optional[float], Optional[float]]] = None,
                framework: Optional[Mapping[str, object]] = None) -> None:
        memory = self._memory.maybe_sample(now_s)
        if framework_memory:
            memory = {**(memory or {}), **{k: v for k, v in framework_memory.items() if v is not None}}
        with self._lock:
            oom_report, self._oom_report = self._oom_report, None
        if oom_report is not None:
            memory = dict(memory or {})
            memory["num_ooms"] = max(memory.get("num_ooms") or 0, self.ooms)
        gpu = torch.cuda.current_device() if cuda_in_use() else self._fallback_gpu
        report = StepReport(
            step=step, rank=self.rank, step_time_s=step_time_s, phases_s=phases, samples=samples, tokens=tokens,
            pid=self._pid, hostname=self._hostname, local_gpu=gpu, memory=memory,
            collective_latency_us=latency_us, component=self._component(gpu),
            collective_baseline_us=self._probe.baseline_us,
            oom=oom_report, rollout_slowest_s=(rollout_s or (None, None))[0],
            rollout_mean_s=(rollout_s or (None, None))[1],
            **{k: v for k, v in (framework or {}).items() if k in FRAMEWORK_FIELDS})
        self.last_report = report
        if self._timer.pending(step) or self._held:  # its GPU time is still to come (or an earlier report's is)
            self._held.append((self._boundaries, report))
        elif self._reporter is not None:
            self._reporter.submit(report.to_wire())
        self._send_held()

    def _send_held(self, wait: bool = False, give_up: bool = False) -> None:
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
                if not give_up and self._boundaries - held_at < GPU_WAIT_STEPS:
                    break
                self._timer.forget(report.step)
            self._held.popleft()
            if self._reporter is not None:
                self._reporter.submit(report.to_wire())

    def _declaration(self, values: Optional[Mapping[str, Number]] = None) -> dict:
        knobs = self._knobs.declaration()
        for name, value in (values or {}).items():
            knobs[name]["value"] = value
        hostnames = [self._hostname] + sorted({p.node for p in self.roles} - {self._hostname})
        return {"name": self.job, "ranks": self.world_size, "device_map": self.device_map,
                "hostnames": hostnames, "knobs": knobs, "mode": self._mode,
                **({"roles": [p.to_wire() for p in self.roles]} if self.roles else {}),
                **({"advise_only_reason": self._advise_only_reason[:1024]} if self._advise_only_reason else {})}

    def _gpu_without_cuda(self, local_gpu: Optional[int]) -> Optional[int]:
        """The local GPU when CUDA is not in use in this process: given, else LOCAL_RANK if the device map has
        it, else the device map's only GPU."""
        if local_gpu is not None:
            return int(local_gpu)
        gpus = {g for ids in self.device_map.values() for g in ids}
        local_rank = os.environ.get("LOCAL_RANK", "")
        if local_rank.isdigit() and int(local_rank) in gpus:
            return int(local_rank)
        return next(iter(gpus)) if len(gpus) == 1 else None

    def _component(self, gpu: Optional[int]) -> Optional[str]:
        """Every component the device map puts on ``gpu`` ("actor+ref" for a shared GPU)."""
        names = sorted(c for c, ids in self.device_map.items() if gpu is not None and gpu in ids)
        return "+".join(names) or None

    def _say(self, key: str, msg: str, **kw) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(msg, **kw)


def attach(job: str, server: Optional[str] = None, token: Optional[str] = None, **options) -> Hook:
    """A :class:`Hook` for ``job``, reporting to ``server`` (None: standalone, no network at all). Call it on
    every rank with the same knobs, after ``torch.distributed.init_process_group`` when the job uses it, and
    call ``step_end`` on every rank at every step (it may run a collective). Never blocks on the network:
    registration happens in the reporter thread. ``token`` defaults to ``$TRIMTAB_TOKEN``. Options: see
    :class:`Hook` (``probe_every``, ``memory_every_s``, ``knob_sync_every``, ``local_gpu``, ``queue_max``,
    ``timeout_s``, …)."""
    return Hook(job, server, token, **options)
