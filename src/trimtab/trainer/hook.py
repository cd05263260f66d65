"""The training-loop hook: times a job's phases, reports each step to the trimtab server from a background thread,
and applies the rebalancer's knob changes at step boundaries, identically on every rank.

    hook = trimtab.trainer.attach(job="ppo-demo", server="http://127.0.0.1:9460", token=os.environ["JOB_TOKEN"],
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

The hook is the public face and the order of a step boundary; each idea lives in a module of its own: phase and
step timing in ``timing.py``, knob changes agreed across ranks and handed to their owners in
``knob_agreement.py``, out-of-memory handling in ``oom.py``, building and holding the step reports in
``outbox.py``, the record of a step in ``step_record.py`` and the link to the server in ``server_link.py``.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
from typing import Any, Mapping, Optional, Sequence, Union

import httpx

from trimtab.contract.knobs import MAX_JOB_NAME, MAX_NAME, MODES as SERVER_MODES, NAME_PATTERN
from trimtab.contract.learning import SIGNAL_NAMES
from trimtab.contract.roles import RolePlacement
from trimtab.trainer.apply import KnobApplier, KnobChange
from trimtab.trainer.backlog import SPOOL_MAX_BYTES
from trimtab.trainer.dist import KnobSync, LatencyProbe, distributed, rank_and_world
from trimtab.trainer.knob_agreement import ChangeCallback, KnobAgreement
from trimtab.trainer.knobs import KnobSet, KnobSpecLike, Number
from trimtab.trainer.oom import OomEvent, OomGuard, OomHandler
from trimtab.trainer.outbox import Outbox
from trimtab.trainer.job_token import job_token
from trimtab.trainer.server_link import Reporter
from trimtab.trainer.step_record import StepReport
from trimtab.trainer.timing import Phase, PhaseTimer

log = logging.getLogger("trimtab.trainer")
# The API's names: one it would refuse is refused here, at attach, rather than by a 422 on every retry.
SLUG = re.compile(NAME_PATTERN)
MODES = (None, *SERVER_MODES)  # None: keep the mode the server has
__all__ = ["ChangeCallback", "Hook", "OomEvent", "attach"]


class Hook:
    """See the module docstring; build one with :func:`attach` on every rank.

    Options: ``device_map`` component → local GPU indices (attribution); ``knobs`` name → (start, min, max);
    ``mode`` auto/advise/off at registration (None keeps the server's); ``probe_every`` steps between latency
    probes (0: off) and ``probe_baseline_n`` probes in the baseline; ``memory_every_s`` between allocator reads;
    ``knob_sync_every`` steps between knob agreements (see ``dist.py``); ``local_gpu`` where CUDA is not in use
    in this process; ``oom_knob`` the knob ``oom_guard`` halves; ``cuda_events`` off to skip event records;
    ``queue_max`` reports kept in memory while the server is away, ``spool_dir`` / ``spool_max_bytes`` where and
    how many bytes of older ones wait on disk (default ``$TRIMTAB_HOOK_SPOOL_DIR``, else ``hook-spool`` in the state
    directory, 64 MiB; 0: no spool), see ``backlog.py``; ``report_batch_max`` the most reports sent in one POST
    (only reports that queued while the last POST was out go together; a job of few-ms steps cannot pay a POST per
    step, see ``server_link.py``; 1: one POST per report); ``report_min_interval_s`` the least time between two
    POSTs' starts (250 ms: steps shorter than that report in batches, a full batch at once; 0: as fast as the
    server answers);
    ``timeout_s`` per HTTP request (≤ 1 s keeps a dying
    server from holding the reporter); ``backoff_max_s`` between retries; ``transport`` an httpx transport (tests);
    ``appliers`` knob → the :class:`~trimtab.trainer.apply.KnobApplier` that owns it (a framework adapter): a
    change of such a knob is acknowledged only once that applier says it took effect, and refused when it cannot
    apply it. Knobs without an applier are owned by the loop that reads ``hook.knobs``; ``advise_only_reason``
    says why a job declares no knobs (its framework cannot change them between steps), for ``trimtab check``;
    ``roles`` where each role runs (:class:`~trimtab.contract.roles.RolePlacement`, found by a framework adapter),
    registered beside the device map (their nodes join the job's hostnames); ``rules`` this job's overrides of the
    daemon's rules, registered with it, in the rules file's shape — e.g. ``{"learning": {"throughput_only":
    ["prefetch"]}}`` for a knob that changes only the job's speed, or ``{"learning": {"changes_learning":
    ["batch_size", "prefetch", "sync_every"]}}`` where a plain loop's batch size changes what is learned (a bad key
    or value is refused by the server, and said once, as a refused registration is).
    """

    def __init__(self, job: str, server: Optional[Union[str, Sequence[str]]] = None, token: Optional[str] = None, *,
                 device_map: Optional[Mapping[str, Sequence[int]]] = None,
                 knobs: Optional[Mapping[str, KnobSpecLike]] = None, mode: Optional[str] = None,
                 probe_every: int = 0, probe_baseline_n: int = 5, memory_every_s: float = 5.0,
                 knob_sync_every: int = 1, local_gpu: Optional[int] = None, oom_knob: str = "batch_size",
                 cuda_events: bool = True, queue_max: int = 256, spool_dir: Optional[str] = None,
                 spool_max_bytes: int = SPOOL_MAX_BYTES, report_batch_max: int = 64,
                 report_min_interval_s: float = 0.25, timeout_s: float = 1.0,
                 backoff_max_s: float = 5.0, transport: Optional[httpx.BaseTransport] = None,
                 appliers: Optional[Mapping[str, KnobApplier]] = None,
                 advise_only_reason: Optional[str] = None, roles: Sequence[RolePlacement] = (),
                 rules: Optional[Mapping[str, Any]] = None):
        if rules is not None and not isinstance(rules, Mapping):
            raise TypeError(f"rules must be a mapping in the rules file's shape, e.g. "
                            f"{{'learning': {{'throughput_only': ['batch_size']}}}}; got {type(rules).__name__}")
        self._rules = dict(rules) if rules else None
        for kind, name, limit in ([("job", job, MAX_JOB_NAME)] + [("knob", k, MAX_NAME) for k in (knobs or {})]
                                  + [("component", c, MAX_NAME) for c in (device_map or {})]):
            if not (isinstance(name, str) and len(name) <= limit and SLUG.match(name)):
                raise ValueError(f"{kind} name {name!r}: letters, digits and . _ - (≤ {limit}), starting with a "
                                 f"letter or digit")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        token = job_token(token)
        self.job, self._mode, self._advise_only_reason = job, mode, advise_only_reason
        self.rank, self.world_size, _ = rank_and_world()
        self.device_map = {str(c): [int(g) for g in gpus] for c, gpus in (device_map or {}).items()}
        self.roles = list(roles)
        self._knobs = KnobSet(knobs)
        self._appliers = dict(appliers or {})
        unknown = sorted(set(self._appliers) - set(self._knobs.names))
        if unknown:
            raise ValueError(f"appliers for undeclared knobs: {', '.join(unknown)}")
        self._timer = PhaseTimer(cuda_events)
        self._probe = LatencyProbe(probe_every, probe_baseline_n)
        self._step, self._boundaries = 0, 0
        self._lock = threading.Lock()  # the knobs and what other threads hand over (OOMs, staged changes)
        self._oom = OomHandler(self._knobs, oom_knob, self._lock, lambda: self._step)
        self._outbox = Outbox(self._timer, self._probe, self._oom, rank=self.rank, device_map=self.device_map,
                              local_gpu=local_gpu, memory_every_s=memory_every_s)
        self._changes = KnobAgreement(self._knobs, self._appliers, self._oom, KnobSync(knob_sync_every),
                                      self._lock, self.rank, self._declaration)
        self._said: set[str] = set()
        self._closed = False
        if server is not None:
            self._reporter = Reporter(
                server, job, token,
                registration=self._declaration() if self.rank == 0 else None,
                on_pending=self._changes.stage if self.rank == 0 else None, queue_max=queue_max,
                timeout_s=timeout_s, backoff_max_s=backoff_max_s, transport=transport, batch_max=report_batch_max,
                min_interval_s=report_min_interval_s, spool_dir=spool_dir, spool_max_bytes=spool_max_bytes,
                spool_name=f"{job}.rank{self.rank}")
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
        self._timer.begin_step()

    def on_change(self, callback: ChangeCallback) -> ChangeCallback:
        """``callback(knob, old, new, change_id)`` on every rank when a knob changes (change_id None: an OOM)."""
        self._changes.callbacks.append(callback)
        return callback

    def claim_knobs(self, applier: KnobApplier) -> list[str]:
        """For a framework adapter that runs the loop itself: ``applier`` owns every declared knob that no applier
        owns yet (there is no user loop to read them). Returns those knobs' names."""
        claimed = [k for k in self._knobs.names if k not in self._appliers]
        for name in claimed:
            self._appliers[name] = applier
        return claimed

    def oom_guard(self) -> OomGuard:
        """``with hook.oom_guard():`` catches an out-of-memory error, reports it, halves ``batch_size`` from the
        next step (within bounds, and never back up to the size that failed), empties the CUDA cache and lets
        the loop go on; ``hook.last_oom`` is set until the next guarded block. Any thread may use it (e.g. a
        generation worker). Only guard code without collectives in a multi-rank job: a rank that skips a
        collective its peers are in would hang them."""
        return self._oom.guard()

    def step_end(self, samples: Optional[float] = None, tokens: Optional[float] = None, *,
                 step: Optional[int] = None, phases_s: Optional[Mapping[str, float]] = None,
                 step_time_s: Optional[float] = None, memory: Optional[Mapping[str, object]] = None,
                 rollout_s: Optional[tuple[Optional[float], Optional[float]]] = None,
                 framework: Optional[Mapping[str, object]] = None,
                 learning: Optional[Mapping[str, float]] = None) -> None:
        """Ends the step: agree on knobs (every rank, same boundary), queue the report, apply changes.

        ``step``: the job's own step number (default: counted from 0). ``phases_s``: phase seconds measured
        elsewhere (a framework's timers), added to the ``phase()`` blocks. ``step_time_s``: the step's duration as
        the framework timed it (default: wall time since the last boundary). ``memory``: allocator figures the
        framework measured where the hook cannot (its workers' GPUs), merged over the hook's own (a CPU job passes
        ``free_bytes`` and ``total_bytes`` as it sees them: memory another process holds lowers the line raises plan
        against). ``rollout_s``: (slowest, mean) sample generation time, the rollout's long tail. ``framework``:
        what the framework logged for the step: ``prompts``, ``completions``, ``completion_mean_tokens``, ``reward_mean``, ``logged``, and a
        prefetching job's ``queue_high_water`` (the most batches that waited unclaimed at once in the step).
        ``learning``: what the step says about learning, by trimtab's names (``reward``, ``clip_fraction``, ``kl``,
        ``eff_sample_size``, ``grad_norm``, ``entropy``, ``stale_share``; see :mod:`trimtab.contract.learning`): a
        change to a knob that changes what is learned is judged on these too. An unknown name is said once and
        left out."""
        now_s = time.perf_counter()
        ended_ms = time.time_ns() // 1_000_000  # the step's time, kept if its report waits out a head outage
        if step is not None:
            self._step = int(step)
        step_no, boundary = self._step, self._boundaries
        # The values the step ran at, before this boundary moves any (an OOM's halving included): the report's label.
        ran_at = dict(self._knobs.values)
        step_time_s = self._timer.step_time_s(now_s) if step_time_s is None else max(0.0, float(step_time_s))
        phases = self._timer.close_step(step_no, step_time_s, phases_s)
        changes, agreed = self._changes.agree(boundary)
        latency_us = self._probe.probe() if self._probe.due(boundary) else None
        resolved_us = self._probe.resolve()
        try:
            self._outbox.report(step_no, boundary, step_time_s, phases, samples, tokens, now_s,
                                latency_us if latency_us is not None else resolved_us, memory, rollout_s, framework,
                                ran_at, ended_ms, learning=self._known_learning(learning))
        except Exception:  # a bug in bookkeeping must not stop training; say it once
            self._say("report", "trimtab: could not build the step report", exc_info=True)
        self._changes.apply(changes, agreed, applied_at_step=step_no + 1)
        self._step, self._boundaries = step_no + 1, boundary + 1
        self._timer.begin_step(now_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued (for at most ``timeout_s``) and stops the reporter thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:  # the last steps' GPU time: waiting for the GPU is fine now, the loop is done
            self._outbox.send_held(self._boundaries, wait=True)
        except Exception:
            self._say("gpu-close", "trimtab: could not resolve the last steps' GPU time", exc_info=True)
            self._outbox.send_held(self._boundaries, give_up=True)
        if self._reporter is not None:
            self._reporter.close(timeout_s)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the loop and its adapters read ------------------------------------------------------------------

    @property
    def ooms(self) -> int:
        """Out-of-memory errors ``oom_guard`` caught so far."""
        return self._oom.ooms

    @property
    def last_oom(self) -> Optional[OomEvent]:
        """The OOM the newest guarded block caught (None: it caught none)."""
        return self._oom.last

    @property
    def last_report(self) -> Optional[StepReport]:
        """The newest step's report, as built at its boundary (its GPU time may still be to come)."""
        return self._outbox.last_report

    @property
    def last_changes(self) -> list[KnobChange]:
        """The changes of the newest boundary, with how they settled."""
        return self._changes.last_changes

    @property
    def stats(self) -> dict:
        """Counters for logs and tests: what became of the step reports (sent, of them stored new, already
        stored and late; rejected; dropped and why; unconfirmed; pending; the spool's bytes — exact, see
        ``report_counts.py``), queued (reports and acks), the server in use, offline (every server away),
        auth_refused (a server answered, and refused the token: not an outage), OOMs, the probe's baseline."""
        r = self._reporter
        reports = r.stats() if r else {"sent": 0, "dropped": 0, "rejected": 0, "offline": False,
                                       "auth_refused": False}
        return {**reports, "queued": r.queued if r else 0, "ooms": self.ooms,
                "collective_baseline_us": self._probe.baseline_us, "collective_last_us": self._probe.last_us}

    # -- the job as the server knows it -----------------------------------------------------------------------

    @property
    def _reporter(self) -> Optional[Reporter]:
        """The server link (None: standalone); the reports and the knob changes share it (tests replace it)."""
        return self._outbox.link

    @_reporter.setter
    def _reporter(self, link: Optional[Reporter]) -> None:
        self._outbox.link = self._changes.link = link

    def _declaration(self, values: Optional[Mapping[str, Number]] = None) -> dict:
        knobs = self._knobs.declaration()
        for name, value in (values or {}).items():
            knobs[name]["value"] = value
        hostname = self._outbox.hostname
        hostnames = [hostname] + sorted({p.node for p in self.roles} - {hostname})
        return {"name": self.job, "ranks": self.world_size, "device_map": self.device_map,
                "hostnames": hostnames, "knobs": knobs, "mode": self._mode,
                **({"roles": [p.to_wire() for p in self.roles]} if self.roles else {}),
                **({"rules": self._rules} if self._rules else {}),
                **({"advise_only_reason": self._advise_only_reason[:1024]} if self._advise_only_reason else {})}

    def _known_learning(self, learning: Optional[Mapping[str, float]]) -> Optional[dict[str, float]]:
        """The signals trimtab knows; an unknown name (a typo, a framework's own name) is said once, not sent."""
        if not learning:
            return None
        unknown = sorted(str(k) for k in learning if k not in SIGNAL_NAMES)
        if unknown:
            self._say("learning-names", f"trimtab: step_end(learning=...) names {', '.join(unknown)} that trimtab "
                                        f"does not know (known: {', '.join(SIGNAL_NAMES)}); left out")
        return {k: v for k, v in learning.items() if k in SIGNAL_NAMES} or None

    def _say(self, key: str, msg: str, **kw) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(msg, **kw)


def attach(job: str, server: Optional[str] = None, token: Optional[str] = None, **options) -> Hook:
    """A :class:`Hook` for ``job``, reporting to ``server`` (None: standalone, no network at all; several URLs, as a
    list or separated by commas: fail-over, see ``server_link.py``). Call it on
    every rank with the same knobs, after ``torch.distributed.init_process_group`` when the job uses it, and
    call ``step_end`` on every rank at every step (it may run a collective). Never blocks on the network:
    registration happens in the reporter thread. ``token`` defaults to ``$TRIMTAB_TOKEN``. Options: see
    :class:`Hook` (``probe_every``, ``memory_every_s``, ``knob_sync_every``, ``local_gpu``, ``queue_max``,
    ``report_batch_max``, ``timeout_s``, …)."""
    return Hook(job, server, token, **options)
