"""trimtab's ``prefetch`` and ``sync_every`` live in verl's V1 ``separate_async`` trainer
(``trainer.v1.trainer_mode=separate_async``, ``verl/trainer/ppo/v1/trainer_separate_async.py``), where verl holds
them in objects it builds at start-up. Each is written into the attribute verl reads at run time, at the one point
of the step where verl has not read it yet, and acknowledged only once verl's own code ran with it.

Where verl 0.9.1 reads them:

* ``sync_every`` = ``trainer.v1.separate_async.parameter_sync_step``: copied into ``PPOTrainer.parameter_sync_step``
  by ``PPOTrainer.__init__``; read at every global step (one weight sync to the rollout replicas, in
  ``on_step_end``) by ``PPOTrainer.step()`` — ``range(self.parameter_sync_step)`` local updates of
  ``data.train_batch_size // parameter_sync_step`` prompts each, counted in ``self.local_trigger_step`` — and by the
  hybrid switch (``_switch_threshold``, ``on_sample_begin``, ``_adapt_switch_threshold``). verl asserts at start
  that ``data.train_batch_size == parameter_sync_step × actor.ppo_mini_batch_size``; ``data.train_batch_size`` is read
  live too (``step()``, ``prepare_step()``'s prompts for the next step: the dataloader yields one prompt at a time,
  ``data.gen_batch_size = 1`` in the async modes). trimtab keeps that invariant with the mini-batch fixed: a step
  of ``k`` updates takes ``k × ppo_mini_batch_size`` prompts, so one optimizer step learns from the same mini-batch
  and a larger ``k`` means fewer weight syncs per sample, as ``trigger_parameter_sync_step`` does in the
  fully-async trainer (:mod:`.verl_async`).
* ``prefetch`` = ``trainer.v1.sampler.max_off_policy_threshold``: held by the replay buffer
  ``PPOTrainer._build_replay_buffer`` builds in ``__init__`` (``ReplayBufferAsync.max_off_policy_threshold``), read
  on every poll of ``sample()`` / ``wait_for_sampleable()`` / ``get_sampleable_count()`` (``drop``: groups spanning
  more versions are evicted; ``wait``: sampling blocks while an in-flight group reached it).

Both are installed in ``on_step_begin`` (wrapped: before verl's), before the step reads either, so no step mixes two
values; ``sync_every`` is acknowledged in ``on_step_end`` once ``step()`` ran that many updates
(``local_trigger_step == k − 1``), ``prefetch`` once a training ``sample()`` of the step ran while the replay buffer
held it — both with the step verl was on. Refused, with why: a value verl asserts against (an integer ≥ 1), outside
the declared bounds, or a step of more prompts than the dataset holds; a trainer whose replay buffer is not built
(or is a custom sampler, which owns its semantics), and knobs verl's config turned off
(``max_off_policy_threshold: null``, rollout skip reading ``parameter_sync_step`` at start) are not declared.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from trimtab.trainer.adapters.verl_staleness import PREFETCH, SYNC_EVERY

log = logging.getLogger("trimtab.trainer")

SEPARATE_ASYNC = "separate_async"
MODE_KEY = "trainer.v1.trainer_mode"
SYNC_KEY = "trainer.v1.separate_async.parameter_sync_step"
THRESHOLD_KEY = "trainer.v1.sampler.max_off_policy_threshold"
MINI_KEY = "actor_rollout_ref.actor.ppo_mini_batch_size"


def separate_async(config: Any) -> bool:
    from trimtab.trainer.adapters.verl_knobs import select

    return str(select(config, MODE_KEY, "")) == SEPARATE_ASYNC


def _whole(value: Any) -> Optional[int]:
    """``value`` as the integer ≥ 1 verl asserts, or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and number >= 1 else None


def _schedule_fixed(config: Any, use_critic: bool) -> Optional[str]:
    """Why more updates per step than at start would run past a schedule verl sized at start, or None."""
    from trimtab.trainer.adapters.verl_knobs import select

    for section in ("actor_rollout_ref.actor.optim",) + (("critic.optim",) if use_critic else ()):
        kind = select(config, f"{section}.lr_scheduler_type")
        if kind is not None and str(kind) != "constant":
            return (f"{section}.lr_scheduler_type={kind} spans total_training_steps × parameter_sync_step optimizer "
                    f"steps, fixed at start: more updates per step would run past it")
    return None


def declare(trainer: Any) -> tuple[dict[str, tuple[tuple[int, int, int], str]], dict[str, str]]:
    """The knobs this separate_async run can move live: knob → ((start, min, max), why-these-bounds), and knob →
    why not, for those it cannot."""
    from trimtab.trainer.adapters.verl_knobs import select

    config = trainer.config
    out: dict[str, tuple[tuple[int, int, int], str]] = {}
    why_not: dict[str, str] = {}
    buffer = getattr(trainer, "replay_buffer", None)
    custom = select(config, "trainer.v1.sampler.custom_sampler.path")
    threshold = getattr(buffer, "max_off_policy_threshold", None)
    if buffer is None:
        why_not[PREFETCH] = "verl's replay buffer is not built"
    elif custom:
        why_not[PREFETCH] = f"a custom sampler ({custom}) owns its off-policy semantics"
    elif _whole(threshold) is None:
        why_not[PREFETCH] = (f"{THRESHOLD_KEY} is {threshold}: verl's off-policy version control is off and trimtab "
                             f"does not turn it on")
    else:
        steps = int(getattr(trainer, "total_training_steps", 0) or 0)
        out[PREFETCH] = ((int(threshold), 1, max(int(threshold), steps)),
                         "≥ 1 (verl asserts); ≤ total_training_steps (no trajectory spans more versions)")
    start, mini = _whole(getattr(trainer, "parameter_sync_step", None)), _whole(select(config, MINI_KEY))
    dataset = getattr(trainer, "train_dataset", None)
    if start is None or mini is None or dataset is None:
        why_not[SYNC_EVERY] = "verl's trainer has no parameter_sync_step, mini-batch or dataset yet"
    elif select(config, "skip.rollout_tq.enable", False):
        why_not[SYNC_EVERY] = "rollout skip (skip.rollout_tq.enable) reads parameter_sync_step once, at start"
    else:
        fixed = _schedule_fixed(config, bool(getattr(trainer, "use_critic", False)))
        top = start if fixed else max(start, len(dataset) // mini)
        out[SYNC_EVERY] = ((start, 1, top), fixed or f"≥ 1; ≤ the dataset's {len(dataset)} prompts / "
                                                      f"ppo_mini_batch_size {mini} (one step's prompts)")
    return out, why_not


class V1AsyncApplier:
    """Owns ``prefetch`` and ``sync_every`` of one separate_async fit: stages the hook's changes, installs them in
    ``on_step_begin`` and acknowledges them in ``on_step_end`` (see the module's docstring)."""

    def __init__(self, trainer: Any, knobs: dict[str, tuple[tuple[int, int, int], str]]):
        self.trainer, self.knobs = trainer, dict(knobs)
        self._lock = threading.Lock()
        self._staged: dict[str, Any] = {}       # knob → KnobChange, from the hook (its step_end, in fit's thread)
        self._installed: dict[str, tuple[Any, int]] = {}  # knob → (change, value): waiting for verl to run with it
        self._reads: list[Any] = []             # the replay buffer's threshold at each training sample() this step
        watch = PREFETCH in self.knobs and getattr(trainer, "replay_buffer", None) is not None
        self._unwatch = self._watch_samples() if watch else (lambda: None)

    # -- the hook's side -------------------------------------------------------------------------------------

    def apply(self, change: Any) -> None:
        why = self.refusal(change.knob, change.new)
        if why is not None:
            log.warning("trimtab: refused %s → %s: %s", change.knob, change.new, why)
            change.refused(why)
            return
        with self._lock:
            self._staged[change.knob] = change  # the newest wins; verl reads it at the next step's start

    def refusal(self, knob: str, value: Any) -> Optional[str]:
        """Why verl cannot run with ``knob`` = ``value`` now, or None."""
        if knob not in self.knobs:
            return f"verl's separate_async trainer has no live setting behind {knob!r} in this run"
        name = SYNC_KEY if knob == SYNC_EVERY else THRESHOLD_KEY
        whole = _whole(value)
        if whole is None:
            return f"{name}={value} is not an integer >= 1 (verl asserts it)"
        (_, low, high), why = self.knobs[knob]
        if not low <= whole <= high:
            return f"{name}={whole} is outside [{low}, {high}]: {why}"
        if knob == PREFETCH and getattr(self.trainer, "replay_buffer", None) is None:
            return "verl's replay buffer is not built"
        return None

    # -- verl's side (fit's thread) ------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Before verl's ``on_step_begin``: the staged values into the objects verl reads them from."""
        with self._lock:
            staged, self._staged = self._staged, {}
            self._reads.clear()
        for knob, change in staged.items():
            why = self.refusal(knob, change.new)
            if why is not None:
                change.refused(why)
                continue
            value = int(change.new)
            (self._install_sync if knob == SYNC_EVERY else self._install_threshold)(value)
            self._installed[knob] = (change, value)

    def end_step(self) -> None:
        """Before verl's ``on_step_end``: what verl's step ran with, acknowledged with that step."""
        trainer, step = self.trainer, int(getattr(self.trainer, "global_steps", 0) or 0)
        for knob, (change, value) in list(self._installed.items()):
            if knob == SYNC_EVERY:
                held, ran = int(trainer.parameter_sync_step), int(trainer.local_trigger_step) + 1
                if held != value:
                    del self._installed[knob]
                    change.refused(f"verl's trainer holds parameter_sync_step={held}, not {value}")
                elif ran == value:  # step() looped range(parameter_sync_step): it read the new value
                    del self._installed[knob]
                    change.applied(step)
            else:
                with self._lock:
                    reads = list(self._reads)
                if value in reads:  # a training sample() ran while the buffer held it
                    del self._installed[knob]
                    change.applied(step)

    def _install_sync(self, value: int) -> None:
        from omegaconf import open_dict

        from trimtab.trainer.adapters.verl_knobs import select

        trainer = self.trainer
        mini = int(select(trainer.config, MINI_KEY))
        with open_dict(trainer.config):  # verl's invariant, train_batch_size = k × mini, kept where it reads both
            trainer.config.data.train_batch_size = value * mini
            trainer.config.trainer.v1.separate_async.parameter_sync_step = value
        trainer.parameter_sync_step = value
        log.info("trimtab: parameter_sync_step → %s (train_batch_size %s) from step %s", value, value * mini,
                 trainer.global_steps)

    def _install_threshold(self, value: int) -> None:
        from omegaconf import open_dict

        trainer = self.trainer
        trainer.replay_buffer.max_off_policy_threshold = value
        with open_dict(trainer.config):
            trainer.config.trainer.v1.sampler.max_off_policy_threshold = value
        log.info("trimtab: max_off_policy_threshold → %s from step %s", value, trainer.global_steps)

    def _watch_samples(self) -> Callable[[], None]:
        """Records the threshold each training ``sample()`` ran with (the replay buffer's own method, unchanged)."""
        buffer = self.trainer.replay_buffer
        original = buffer.sample

        def sample(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if kwargs.get("partition_id", args[1] if len(args) > 1 else None) == "train":
                with self._lock:
                    self._reads.append(buffer.max_off_policy_threshold)
            return result

        buffer.sample = sample

        def unwatch() -> None:
            if buffer.__dict__.get("sample") is sample:
                del buffer.sample

        return unwatch

    def close(self) -> None:
        self._unwatch()


# -- wrappers (installed by verl_plugin's post-import hook) -----------------------------------------------------

def _wrap_hook(original: Callable, method: str) -> Callable:
    import functools

    from trimtab.trainer.adapters.verl_plugin import WRAPPED, current_session

    @functools.wraps(original)
    def hook(self, *args, **kwargs):
        applier = getattr(current_session(), "v1_async", None)
        if applier is not None and applier.trainer is self:
            try:
                getattr(applier, method)()
            except Exception:  # a knob trimtab cannot move must not stop training
                log.warning("trimtab: could not %s a knob change in verl's separate_async step",
                            "install" if method == "begin_step" else "acknowledge", exc_info=True)
        return original(self, *args, **kwargs)

    setattr(hook, WRAPPED, True)
    return hook


def patch_separate_async(module: Any) -> None:
    from trimtab.trainer.adapters.verl_plugin import _install

    _install(module.PPOTrainerSeparateAsync, "on_step_begin", lambda f: _wrap_hook(f, "begin_step"), ("self",))
    _install(module.PPOTrainerSeparateAsync, "on_step_end", lambda f: _wrap_hook(f, "end_step"), ("self",))


TARGETS: dict[str, Callable[[Any], None]] = {"verl.trainer.ppo.v1.trainer_separate_async": patch_separate_async}
