"""trimtab inside verl's asynchronous trainers, where the prefetch and sync frequency trimtab moves are verl's own
settings.

verl 0.9.1 ships two trainers whose ``fit`` is ``async def`` and overrides the ``RayPPOTrainer.fit`` the plugin wraps
(:mod:`~trimtab.trainer.adapters.verl_plugin` installs the wrappers below through the same post-import hook):

* ``verl/experimental/fully_async_policy/``: ``FullyAsyncTrainer`` and ``FullyAsyncRollouter``, two Ray actors on
  their own GPU pools, joined by a ``MessageQueue``. Each process attaches as its own part of one job: the trainer
  as rank 0 (component ``actor``; it registers the job with ``ranks=2`` and every role: its own worker groups' and
  the rollouter's replicas', :func:`~trimtab.trainer.adapters.verl_roles.rollouter_workers`; the rollouter only
  reports, so no second registration overwrites them), the rollouter as rank 1 (component ``rollout``), so a step
  is judged when both sides reported it. A step is one parameter version (what verl logs:
  the trainer's ``Tracking.log`` of its sync cycle, summed over ``trigger_parameter_sync_step`` micro-steps; the
  rollouter's window between two ``reset_staleness()`` calls, generating vs. paused on its staleness bound, and
  how far it got ahead as ``queue_high_water`` (:func:`.verl_staleness.versions_ahead`), so that a ``prefetch``
  raise is skipped where the rollouter never reached its bound, :mod:`trimtab.control.queue_use`).
* ``verl/experimental/one_step_off_policy/``: ``OneStepOffRayTrainer.fit`` runs in one process; it attaches like the
  legacy trainer (same session, its own phase mapping in :mod:`~trimtab.trainer.adapters.verl_metrics`), reporting
  only: its generation is fixed one step ahead, so it has neither knob.

The two knobs, by their trimtab names so that ``src/trimtab/grading/rules.toml`` moves them unchanged:

* ``prefetch`` = ``async_training.staleness_threshold``: owned by the rollouter (``self.staleness_threshold``). It
  is applied inside ``reset_staleness()`` — right after verl reset its staleness count at a parameter sync — by
  setting the attribute and calling verl's own ``set_max_required_samples()``, which re-derives
  ``max_required_samples`` / ``max_concurrent_samples`` / ``max_queue_size`` under the rollouter's lock.
* ``sync_every`` = ``async_training.trigger_parameter_sync_step``: owned by the trainer
  (``self.trigger_parameter_sync_step``, read by ``_fit_update_local_step``); applied at the start of a sync cycle
  (``local_trigger_step == 1``) so a cycle never mixes two values, and acknowledged once verl's next ``fit_step`` ran
  with it. The rollouter derives ``max_required_samples`` from it too (from its config): told by the trainer in band
  (a Ray call to its actor), it re-derives at the same sync point, so both processes move together. verl's checkpoint
  resume does not see it: it recomputes its step and sample counters as version × the configured value
  (``load_checkpoint`` of both), so a resumed run's counters are off by what the live value changed (docs/verl.md).

One invariant verl fixes at start-up bounds both: the ``MessageQueue`` is created with
``max_queue_size = required_samples × (staleness_threshold + 1) × trigger_parameter_sync_step`` (a ``deque`` of
that ``maxlen``). A pair of values whose product needs more drops the oldest samples, so it is refused, with that
reason. When verl's own ``DynamicResourceController`` is on (``async_training.use_dynamic_resource_scheduling``),
its policy reads both values every step (``DynamicScheduleContext``): trimtab declares no knobs, says why in
``trimtab check``, and only reports.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Callable, Optional

from trimtab.trainer.adapters.learning_names import LearningNames
from trimtab.trainer.adapters.verl_async_channel import _Channel
from trimtab.trainer.adapters.verl_staleness import PREFETCH, SYNC_EVERY, AsyncLimits, versions_ahead

log = logging.getLogger("trimtab.trainer")

TRAINER_RANK, ROLLOUT_RANK = 0, 1
DYNAMIC_SCHEDULING = "async_training.use_dynamic_resource_scheduling"
DYNAMIC_REASON = ("verl's DynamicResourceController (async_training.use_dynamic_resource_scheduling) moves trainer "
                  "GPUs to rollout and reads staleness_threshold and trigger_parameter_sync_step every step: "
                  "trimtab reports and leaves them to it")
SESSION_ATTR = "_trimtab_async_session"


def _dynamic(config: Any) -> bool:
    from trimtab.trainer.adapters.verl_knobs import select

    return bool(select(config, DYNAMIC_SCHEDULING, False))


class TrainerSession:
    """The fully-async trainer's side: registers the job, reports each sync cycle, owns ``sync_every``."""

    kind = "fully_async"

    def __init__(self, trainer: Any, options: dict):
        from trimtab.contract.roles import device_map_of
        from trimtab.trainer.knobs import KnobSet

        config = trainer.config
        self.trainer, self.limits = trainer, AsyncLimits.of(config)
        self.dynamic = _dynamic(config)
        knobs = {} if self.dynamic or not options["knobs"] else self.limits.knobs(
            trainer.staleness_threshold, trainer.trigger_parameter_sync_step)
        roles = self.find_roles(trainer)
        device_map = options.get("device_map") or device_map_of(roles)
        declaration = {"name": options["job"], "ranks": 2, "device_map": {r: list(g) for r, g in device_map.items()},
                       "hostnames": [socket.gethostname()] + sorted({p.node for p in roles} - {socket.gethostname()}),
                       "knobs": KnobSet(knobs).declaration(), "mode": options["mode"]}
        if roles:
            declaration["roles"] = [p.to_wire() for p in roles]
        reason = DYNAMIC_REASON if self.dynamic else None if options["knobs"] else "+trimtab.knobs=false"
        if reason:
            declaration["advise_only_reason"] = reason
        self.channel = _Channel(options, TRAINER_RANK, (SYNC_EVERY,) if SYNC_EVERY in knobs else (), declaration)
        self.unmapped: set[str] = set()
        self.learning_names = LearningNames("verl")
        log.warning("trimtab: attached to verl's FullyAsyncTrainer as job %r rank 0 (actor), knobs: %s%s",
                    options["job"], ", ".join(f"{k} {v}" for k, v in knobs.items()) or "none",
                    f" ({reason})" if reason else "")

    @staticmethod
    def find_roles(trainer: Any) -> list:
        """The whole job's roles, registered here (the rollouter registers nothing): the trainer's worker groups
        (actor; ref, critic where present) and the rollouter's replicas (rollout), asked of its Ray actor."""
        from trimtab.trainer.adapters.verl_roles import find_roles, rollouter_workers

        return find_roles(trainer, rollout_workers=rollouter_workers(trainer.rollouter))

    def on_log(self, data: Any, step: Any) -> None:
        from trimtab.trainer.adapters.verl_metrics import verl_step

        record = verl_step(step, data, trainer=self.kind, names=self.learning_names)
        if record is None:
            return  # the sync's rollouter timings and validation lines: not a step
        new = set(record.unmapped_timers) - self.unmapped
        if new:
            self.unmapped |= new
            log.warning("trimtab: verl timers counted as 'other': %s", ", ".join(sorted(new)))
        self.channel.report(record)

    async def before_step(self) -> Optional[tuple[int, int]]:
        """At a sync cycle's start: the staged ``sync_every`` installed where verl reads it, as (change, step)."""
        import asyncio

        trainer = self.trainer
        if trainer.local_trigger_step != 1:
            return None
        staged = self.channel.take(SYNC_EVERY)
        if staged is None:
            return None
        cid, value = staged
        # The rollouter's state now, from verl's own get_statistics() (the samples' copy lags by a queue's worth)
        stats = await asyncio.wrap_future(trainer.rollouter.get_statistics.remote().future())
        staleness = float(stats["static/staleness_threshold"])
        why = self.limits.refusal(staleness, value) or await self._tell_rollouter(int(value))
        if why is not None:
            log.warning("trimtab: refused sync_every → %s: %s", value, why)
            self.channel.reporter.refuse(cid, TRAINER_RANK, why)
            return None
        needed = int(self.limits.required_samples * (staleness + 1) * int(value))
        if int(value) > trainer.trigger_parameter_sync_step and (stats["static/max_required_samples"] or 0) < needed:
            # A longer cycle needs more samples per version than the rollouter's bound lets it make: it re-derives
            # first (at its next sync), or this cycle would wait forever on a paused rollouter.
            self.channel.put_back(SYNC_EVERY, cid, value)
            return None
        trainer.trigger_parameter_sync_step = int(value)
        trainer.dynamic_schedule_ctx.trigger_parameter_sync_step = int(value)  # verl's own copy for its policy
        return cid, int(trainer.current_param_version) + 1  # the version this cycle produces: its logged step

    async def _tell_rollouter(self, value: int) -> Optional[str]:
        """The rollouter re-derives its bound from ``sync_every`` too: told here, in band (a Ray call to its actor),
        or why not. Not left to its own report replies from the server: this side's ack may land before the
        rollouter's next reply lists the change as pending, and a shorter cycle was then never followed (seen in CI:
        its bound stayed at the longer one). A cycle the rollouter does not follow would run on its old bound."""
        import asyncio

        try:
            await asyncio.wrap_future(self.trainer.rollouter.__ray_call__.remote(_follow_sync, value).future())
        except Exception as exc:
            return f"could not tell verl's rollouter (its bound follows sync_every): {exc!r}"
        return None

    def after_step(self, applied: Optional[tuple[int, int]]) -> None:
        if applied is not None:  # verl's fit_step ran with it (its _fit_update_local_step read it): now it counts
            self.channel.reporter.ack(applied[0], applied[1], TRAINER_RANK)

    def close(self) -> None:
        self.channel.close()


class RolloutSession:
    """The rollouter's side: reports each parameter version's window, owns ``prefetch``, follows ``sync_every``."""

    def __init__(self, rollouter: Any, options: dict):
        self.rollouter, self.limits = rollouter, AsyncLimits.of(rollouter.config)
        self.dynamic = _dynamic(rollouter.config)
        owned = () if self.dynamic or not options["knobs"] else (PREFETCH,)  # sync_every: told by the trainer
        self.channel = _Channel(options, ROLLOUT_RANK, owned, None)
        self.syncs = 0
        self._sync_target: Optional[int] = None   # a sync_every the trainer takes; re-derived here when safe
        self._taken: Optional[int] = None         # samples the trainer had taken from the queue at the last sync
        log.warning("trimtab: attached to verl's FullyAsyncRollouter as job %r rank 1 (rollout)", options["job"])

    def follow_sync(self, value: int) -> None:
        """The trainer's ``sync_every`` (told in band, :func:`_follow_sync`), re-derived at the next sync where
        safe (:meth:`apply`); one verl cannot run with is left alone (the trainer refuses it too)."""
        if self.limits.refusal(float(self.rollouter.staleness_threshold), value) is None:
            self._sync_target = int(value)

    def window(self) -> Optional[int]:
        """Read just before verl's ``reset_staleness()``: how far this version's window got ahead
        (:func:`versions_ahead`), or None where verl has not sized its bound yet."""
        r = self.rollouter
        if r.max_required_samples is None:
            return None
        version = self.limits.required_samples * int(r.config.async_training.trigger_parameter_sync_step)
        return versions_ahead(int(r.staleness_samples), int(r.max_required_samples), version,
                              float(r.staleness_threshold))

    def on_reset(self, timing: dict, ahead: Optional[int] = None) -> None:
        """verl's ``reset_staleness()`` result: the window that ended with this parameter sync (``ahead``: read
        before it, :meth:`window`)."""
        from trimtab.trainer.adapters.verl_metrics import VerlStep, number

        self.syncs += 1
        version_s = number(timing.get("fully_async/rollouter/version_time")) or 0.0
        active_s = min(version_s, number(timing.get("fully_async/rollouter/active_time")) or 0.0)
        samples = number(timing.get("fully_async/rollouter/step_generated_samples"))
        self.channel.report(VerlStep(step=self.syncs, step_time_s=version_s,
                                     phases_s={"generation": active_s, "wait": version_s - active_s, "other": 0.0},
                                     samples=None if samples is None else int(samples), queue_high_water=ahead))

    async def apply(self) -> None:
        """Right after verl reset its staleness count at a sync, holding no lock (``set_max_required_samples`` takes
        verl's): the staged changes, where safe. Owning no knob (dynamic scheduling, ``+trimtab.knobs=false``) there
        is nothing to stage and no queue to ask about."""
        if not self.channel.owned:
            return
        r = self.rollouter
        trigger = int(r.config.async_training.trigger_parameter_sync_step)
        taken = r.total_generated_samples - await r.message_queue_client.get_queue_size()
        cycle_samples, self._taken = (None if self._taken is None else taken - self._taken), taken
        target = self._sync_target  # the trainer acknowledges; here only what verl derives from it
        # A longer cycle: re-derive now (the trainer waits for it). A shorter one: only once the trainer's last cycle
        # took that many samples (it switched), or the rollouter would pause short of what the trainer still needs.
        if target is not None and (target > trigger or cycle_samples == self.limits.required_samples * target):
            from omegaconf import open_dict

            with open_dict(r.config):
                r.config.async_training.trigger_parameter_sync_step = target
            await r.set_max_required_samples()
            trigger, self._sync_target = target, None
        staged = self.channel.take(PREFETCH)
        if staged is None:
            return
        cid, value = staged
        why = self.limits.refusal(float(value), trigger)
        if why is not None:
            log.warning("trimtab: refused prefetch → %s: %s", value, why)
            self.channel.reporter.refuse(cid, ROLLOUT_RANK, why)
            return
        # The trainer's copy of staleness_threshold is read only by dynamic scheduling, when trimtab declares nothing.
        r.staleness_threshold = float(value) if not float(value).is_integer() else int(value)
        await r.set_max_required_samples()  # verl's own re-derivation, under its lock
        self.channel.reporter.ack(cid, self.syncs + 1, ROLLOUT_RANK)  # in effect for the next version's window

    def close(self) -> None:
        self.channel.close()


def _follow_sync(rollouter: Any, value: int) -> None:
    """Run in the rollouter's actor (Ray's ``__ray_call__``): its session follows the trainer's ``sync_every``. A
    rollouter trimtab is not attached to could not: an error, so the trainer refuses the change with why."""
    session = getattr(rollouter, SESSION_ATTR, None)
    if session is None:
        raise RuntimeError("trimtab is not attached to verl's rollouter (its plugin did not load in that process)")
    session.follow_sync(value)


# -- wrappers (installed by verl_plugin's post-import hook) -----------------------------------------------------

def _wrap_async_fit(original: Callable, make: Callable[[Any, dict], Any]) -> Callable:
    import functools

    from trimtab.trainer.adapters.verl_plugin import WRAPPED, bound, start_session

    @functools.wraps(original)
    async def fit(self, *args, **kwargs):
        if getattr(self, SESSION_ATTR, None) is not None:
            return await original(self, *args, **kwargs)
        session = start_session(self, make, "async fit()")
        setattr(self, SESSION_ATTR, session)
        try:
            with bound(session):  # Tracking.log inside this fit reports through it
                return await original(self, *args, **kwargs)
        finally:
            setattr(self, SESSION_ATTR, None)

    setattr(fit, WRAPPED, True)
    return fit


def _wrap_fit_step(original: Callable) -> Callable:
    import functools

    from trimtab.trainer.adapters.verl_plugin import WRAPPED

    @functools.wraps(original)
    async def fit_step(self, *args, **kwargs):
        session = getattr(self, SESSION_ATTR, None)
        applied = None
        if session is not None:
            try:
                applied = await session.before_step()
            except Exception:
                log.warning("trimtab: could not apply a change to verl's trainer", exc_info=True)
        result = await original(self, *args, **kwargs)
        if session is not None:
            session.after_step(applied)
        return result

    setattr(fit_step, WRAPPED, True)
    return fit_step


def _wrap_reset(original: Callable) -> Callable:
    import functools

    from trimtab.trainer.adapters.verl_plugin import WRAPPED

    @functools.wraps(original)
    async def reset_staleness(self, *args, **kwargs):
        session = getattr(self, SESSION_ATTR, None)
        ahead = None
        if session is not None:
            try:
                ahead = session.window()  # the count verl is about to reset: the window's furthest
            except Exception:
                log.warning("trimtab: could not read verl's staleness count", exc_info=True)
        timing = await original(self, *args, **kwargs)
        if session is not None:
            try:
                session.on_reset(timing, ahead)
                await session.apply()
            except Exception:
                log.warning("trimtab: could not report or apply at verl's parameter sync", exc_info=True)
        return timing

    setattr(reset_staleness, WRAPPED, True)
    return reset_staleness


def patch_trainer(module: Any) -> None:
    from trimtab.trainer.adapters.verl_plugin import _install

    cls = getattr(module.FullyAsyncTrainer, "__ray_actor_class__", module.FullyAsyncTrainer)  # under @ray.remote
    _install(cls, "fit", lambda f: _wrap_async_fit(f, TrainerSession), ("self",))
    _install(cls, "fit_step", _wrap_fit_step, ("self",))


def patch_rollouter(module: Any) -> None:
    from trimtab.trainer.adapters.verl_plugin import _install

    cls = getattr(module.FullyAsyncRollouter, "__ray_actor_class__", module.FullyAsyncRollouter)
    _install(cls, "fit", lambda f: _wrap_async_fit(f, RolloutSession), ("self",))
    _install(cls, "reset_staleness", _wrap_reset, ("self",))


def patch_one_step_off(module: Any) -> None:
    from trimtab.trainer.adapters.verl_plugin import VerlSession, _install

    # Report only: its worker calls go through the same proxies as the legacy trainer's, but no test here shows a
    # micro-batch change reaching them (and bypass mode makes some calls moot), so none is declared yet.
    _install(module.OneStepOffRayTrainer, "fit",
             lambda f: _wrap_async_fit(f, lambda trainer, options: VerlSession(trainer, "one_step_off",
                                                                               {**options, "knobs": False})),
             ("self",))


TARGETS: dict[str, Callable[[Any], None]] = {
    "verl.experimental.fully_async_policy.fully_async_trainer": patch_trainer,
    "verl.experimental.fully_async_policy.fully_async_rollouter": patch_rollouter,
    "verl.experimental.one_step_off_policy.ray_trainer": patch_one_step_off,
}
