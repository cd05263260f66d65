"""The live knobs verl really honours: micro-batch sizes and token budgets per GPU, carried in each worker call's data.

verl's workers fix their engine config at ``init_model``; the driver's config is never read again by them, so
writing it (what this module used to do) changes nothing. What a worker *does* read per call is the call's data:
``TrainingWorker.train_batch`` / ``infer_batch`` (``verl/workers/engine_workers.py``) take
``micro_batch_size_per_gpu`` (and ``max_token_len_per_gpu``, ``use_dynamic_bsz``) from the engine config *only if
the data does not carry the key*, and ``prepare_micro_batches`` then chunks by it. The legacy trainer hands workers
a TensorDict (``tu.assign_non_tensor`` keys); V1 hands a ``KVBatchMeta`` whose ``extra_info`` becomes those keys on
the worker side (``verl/utils/transferqueue_utils.py``). So each knob below is put into the data of its own call,
right before verl makes it, and is acknowledged only once a call carried it.

Knobs, each declared only when the run's config makes it safe (a fixed micro-batch size is in use: under
``use_dynamic_bsz`` the worker packs by tokens and ignores it; the setting is an int):

==============================  ================================  ==========================================
knob                            verl call                          start value (bounds: 1 … per-GPU batch)
==============================  ================================  ==========================================
``actor_update_micro_batch``    ``actor_rollout_wg.update_actor``  ``actor.ppo_micro_batch_size_per_gpu``
``log_prob_micro_batch``        ``actor_rollout_wg.compute_log_prob``  ``rollout.log_prob_micro_batch_size_per_gpu``
``ref_log_prob_micro_batch``    ``ref_policy_wg.compute_ref_log_prob`` ``ref.log_prob_micro_batch_size_per_gpu``
==============================  ================================  ==========================================

Under dynamic batching (``use_dynamic_bsz``, 73 of verl's 107 example scripts) the worker packs micro-batches by
tokens instead, up to ``max_token_len_per_gpu`` — taken from the call's data the same way. Those runs get the token
budgets (names end in ``_max_tokens``: a memory model reads them as tokens, not samples):

==============================  ==========================================  ===================================
knob                            verl call                                   start value
==============================  ==========================================  ===================================
``actor_update_max_tokens``     ``actor_rollout_wg.update_actor``           ``actor.ppo_max_token_len_per_gpu``
``log_prob_max_tokens``         ``actor_rollout_wg.compute_log_prob``       ``rollout.log_prob_max_token_len_per_gpu``
``ref_log_prob_max_tokens``     ``ref_policy_wg.compute_ref_log_prob``      ``ref.log_prob_max_token_len_per_gpu``
``critic_max_tokens``           ``critic_wg.train_mini_batch``              ``critic.ppo_max_token_len_per_gpu``
                                                                            (V1: ``ppo_infer_max_token_len_per_gpu``)
``critic_values_max_tokens``    ``critic_wg.infer_batch``                   ``critic.ppo_infer_max_token_len_per_gpu``
==============================  ==========================================  ===================================

Bounds: from the longest sequence the run allows (``data.max_prompt_length + data.max_response_length``, divided by
the role's Ulysses sequence-parallel size: verl's ``rearrange_micro_batches`` asserts ``max_token_len_per_gpu × sp
>= the longest sequence`` of the call and kills the run otherwise) up to the tokens of the whole per-GPU batch at
that length (a larger budget packs nothing more). A run whose configured budget is already below that floor gets
no knob: verl itself would fail on its first long sequence. A change below the floor is refused with that reason.

The critic's micro-batch size has no knob: verl 0.9.1 copies neither ``critic.ppo_micro_batch_size_per_gpu`` nor
``critic.use_dynamic_bsz`` into the critic's engine config, which keeps its default of dynamic batching by tokens —
a micro-batch size carried in the critic's calls would be ignored. That same default is why the critic's token
budgets are declared in every run with a critic (its engine honours them whatever ``critic.use_dynamic_bsz`` says).

A micro-batch size that does not divide the call's per-GPU batch would trip the worker's own assert and kill the
run, so such a change is refused (with the sizes) and the call goes out as before. Micro-batching and token budgets
change memory and speed, never the maths: gradients are accumulated over the same mini-batch.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from trimtab.trainer.apply import KnobChange

log = logging.getLogger("trimtab.trainer")
MICRO_KEY = "micro_batch_size_per_gpu"  # the keys the workers read from the call's data
TOKENS_KEY = "max_token_len_per_gpu"


@dataclass(frozen=True)
class CallKnob:
    knob: str           # trimtab's name
    group: str          # the trainer attribute holding the worker group
    method: str         # the worker-group call that carries it
    section: str        # where the run's config sets it
    keys: tuple[str, ...]  # … under the first of these keys that is set
    dynamic_key: str    # the dynamic-batching switch that makes it moot
    per: str            # "mini": divides the per-GPU mini-batch (updates); "batch": the per-GPU batch (inference)
    key: str = MICRO_KEY  # the data key it is carried under
    sp_key: str = ""    # token budgets: the role's Ulysses sequence-parallel size (verl multiplies the budget by it)
    default: Optional[int] = None  # verl's dataclass default where the run's config lacks every key
    v1_keys: tuple[str, ...] = ()  # where V1's trainer reads it instead (critic: its infer budget for training too)

    @property
    def tokens(self) -> bool:
        return self.key == TOKENS_KEY


def _budget(knob: str, group: str, method: str, section: str, key: str, dynamic_key: str, per: str,
            **more: Any) -> CallKnob:
    more.setdefault("sp_key", f"{section}.ulysses_sequence_parallel_size")
    return CallKnob(knob, group, method, section, (key,), dynamic_key, per, TOKENS_KEY, **more)


CALL_KNOBS = (
    CallKnob("actor_update_micro_batch", "actor_rollout_wg", "update_actor", "actor_rollout_ref.actor",
             ("ppo_micro_batch_size_per_gpu",), "use_dynamic_bsz", "mini"),
    CallKnob("log_prob_micro_batch", "actor_rollout_wg", "compute_log_prob", "actor_rollout_ref.rollout",
             ("log_prob_micro_batch_size_per_gpu",), "log_prob_use_dynamic_bsz", "batch"),
    CallKnob("ref_log_prob_micro_batch", "ref_policy_wg", "compute_ref_log_prob", "actor_rollout_ref.ref",
             ("log_prob_micro_batch_size_per_gpu",), "log_prob_use_dynamic_bsz", "batch"),
    # dynamic_key "" below: the critic's engine batches by tokens in every run (see the module's docstring)
    _budget("actor_update_max_tokens", "actor_rollout_wg", "update_actor", "actor_rollout_ref.actor",
            "ppo_max_token_len_per_gpu", "use_dynamic_bsz", "mini"),
    _budget("log_prob_max_tokens", "actor_rollout_wg", "compute_log_prob", "actor_rollout_ref.rollout",
            "log_prob_max_token_len_per_gpu", "log_prob_use_dynamic_bsz", "batch",
            sp_key="actor_rollout_ref.actor.ulysses_sequence_parallel_size"),  # the actor's engine runs it
    _budget("ref_log_prob_max_tokens", "ref_policy_wg", "compute_ref_log_prob", "actor_rollout_ref.ref",
            "log_prob_max_token_len_per_gpu", "log_prob_use_dynamic_bsz", "batch"),
    _budget("critic_max_tokens", "critic_wg", "train_mini_batch", "critic", "ppo_max_token_len_per_gpu", "",
            "mini", default=32768, v1_keys=("ppo_infer_max_token_len_per_gpu",)),
    _budget("critic_values_max_tokens", "critic_wg", "infer_batch", "critic", "ppo_infer_max_token_len_per_gpu", "",
            "batch", default=32768),  # CriticConfig's default: verl's critic.yaml does not set it
)
# Never moved by these knobs. V1 separate_async's parameter_sync_step (train_batch_size following it) and
# max_off_policy_threshold are moved by their own applier, :mod:`.verl_v1_async`, in that trainer only.
NEVER_TOUCHED = ("data.train_batch_size", "*.ppo_mini_batch_size", "actor_rollout_ref.rollout.n",
                 "actor_rollout_ref.rollout.gpu_memory_utilization", "algorithm.*", "*.optim.*",
                 "trainer.v1.*.parameter_sync_step", "trainer.v1.sampler.max_off_policy_threshold")


def select(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b`` for ``"a.b"`` on a DictConfig, dict or object; ``default`` where a part is missing."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # OmegaConf raises on a missing interpolation
            return default
    return default if node is None else node


def _int(x: Any) -> Optional[int]:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def longest_sequence(config: Any) -> Optional[int]:
    """The longest sequence the run allows, in tokens: prompt plus response (None when the config lacks either)."""
    prompt, response = _int(select(config, "data.max_prompt_length")), _int(select(config, "data.max_response_length"))
    return prompt + response if prompt and response else None


def declared_knobs(config: Any, ref_in_actor: bool = False, use_critic: bool = True,
                   use_reference: bool = True, v1: bool = False
                   ) -> dict[str, tuple[CallKnob, tuple[int, int, int], str]]:
    """The knobs this run can change live: knob → (call, (start, min, max), why-these-bounds). A knob whose
    component is absent (no critic, no separate reference) or that the batching mode makes moot is left out:
    micro-batch sizes under dynamic batching, token budgets without it."""
    world = (_int(select(config, "trainer.n_gpus_per_node")) or 1) * (_int(select(config, "trainer.nnodes")) or 1)
    n = _int(select(config, "actor_rollout_ref.rollout.n")) or 1
    batch = _int(select(config, "data.train_batch_size"))
    longest = longest_sequence(config)
    out = {}
    for call in CALL_KNOBS:
        if call.group == "critic_wg" and not use_critic:
            continue
        if call.group == "ref_policy_wg" and (ref_in_actor or not use_reference):
            continue
        keys = call.v1_keys if v1 and call.v1_keys else call.keys
        start = next((v for v in (_int(select(config, f"{call.section}.{k}")) for k in keys) if v), call.default)
        dynamic = not call.dynamic_key or bool(select(config, f"{call.section}.{call.dynamic_key}", False))
        if start is None or dynamic != call.tokens:
            continue
        if call.per == "mini":
            mini = _int(select(config, f"{call.section}.ppo_mini_batch_size"))
            per_gpu = (mini * n) // world if mini else None
            what = f"{call.section}.ppo_mini_batch_size × rollout.n / {world} GPUs"
        else:
            per_gpu = (batch * n) // world if batch else None
            what = f"data.train_batch_size × rollout.n / {world} GPUs"
        if not call.tokens:
            out[call.knob] = (call, (start, 1, max(start, per_gpu or start)), what)
            continue
        if longest is None:
            continue  # no floor to keep verl's assert true: no knob
        sp = _int(select(config, call.sp_key)) or 1
        floor = -(-longest // sp)
        if start < floor:
            log.warning("trimtab: %s starts at %s tokens, below the longest sequence the run allows (%s / sp %s): "
                        "verl will fail on it; no knob", call.knob, start, longest, sp)
            continue
        top = max(start, (per_gpu or 1) * floor)
        out[call.knob] = (call, (start, floor, top),
                          f"≥ (max_prompt_length + max_response_length) {longest} / sp {sp}; ≤ that × ({what})")
    return out


class _Carried:
    """The data of one worker call, whichever form verl gives it: a TensorDict (legacy) or a KVBatchMeta (V1)."""

    def __init__(self, data: Any):
        self.data = data
        self.meta = getattr(data, "extra_info", None) if not hasattr(data, "batch_size") else None

    def size(self) -> Optional[int]:
        try:
            return int(len(self.data))
        except TypeError:
            return None

    def get(self, key: str) -> Any:
        if self.meta is not None:
            return self.meta.get(key)
        if key not in self.data.keys():
            return None
        from verl.utils import tensordict_utils as tu

        return tu.get(self.data, key)

    def put(self, key: str, value: Any) -> None:
        if self.meta is not None:
            self.meta[key] = value
        else:
            from verl.utils import tensordict_utils as tu

            tu.assign_non_tensor(self.data, **{key: value})

    def remove(self, key: str) -> None:
        if self.meta is not None:
            self.meta.pop(key, None)
        elif key in self.data.keys():
            del self.data[key]


class VerlKnobApplier:
    """Owns the declared knobs: holds the value each call should carry and puts it into that call's data.

    ``apply`` (from the hook, at the step boundary) only installs the value; the first worker call that carries it
    settles the change as applied at the step verl is then on (``step_of()``). ``world_size_of(group)`` gives the
    worker group's size when the group does not say (tests)."""

    def __init__(self, knobs: Mapping[str, tuple[CallKnob, tuple[int, int, int], str]],
                 step_of: Callable[[], int], world_size: int = 1):
        self.knobs = dict(knobs)
        self._step_of = step_of
        self._world_size = world_size
        self._value: dict[str, int] = {k: spec[0] for k, (_, spec, _) in self.knobs.items()}
        self._configured = dict(self._value)
        self._pending: dict[str, KnobChange] = {}
        self._lock = threading.Lock()
        self.calls_carried = 0

    # -- the hook's side -------------------------------------------------------------------------------------

    def apply(self, change: KnobChange) -> None:
        if change.knob not in self.knobs:
            change.refused(f"verl has no live setting behind {change.knob!r}")
            return
        with self._lock:
            self._value[change.knob] = int(change.new)
            if change.change_id is not None:
                self._pending[change.knob] = change
        if change.change_id is None:
            change.applied()  # the hook's own move (an OOM): nothing to acknowledge

    # -- the worker calls' side ------------------------------------------------------------------------------

    def carry(self, call: CallKnob, data: Any, group: Any) -> Optional[tuple[str, Any]]:
        """Puts ``call``'s knob into ``data``; returns what to restore after the call (None: nothing done)."""
        carried = _Carried(data)
        with self._lock:
            value, pending = self._value[call.knob], self._pending.pop(call.knob, None)
        why = self._unsafe(call, value, carried, getattr(group, "world_size", None) or self._world_size)
        if why is not None:
            if pending is not None:
                pending.refused(why)
            log.warning("trimtab: %s; %s stays %s", why, call.knob, self._fallback(call.knob, pending))
            value = self._fallback(call.knob, pending)
            with self._lock:
                self._value[call.knob] = value
            pending = None
        undo = None
        if value != self._configured[call.knob]:  # the configured value is the worker's own default: no key needed
            previous = carried.get(call.key)
            carried.put(call.key, value)
            self.calls_carried += 1
            undo = (call.key, previous)
        if pending is not None:
            pending.applied(self._step_of())
        return undo

    def restore(self, data: Any, undo: Optional[tuple[str, Any]]) -> None:
        """Takes the key back out after the call: V1 reuses one ``extra_info`` dict for every call of a step."""
        if undo is None:
            return
        key, previous = undo
        carried = _Carried(data)
        if previous is None:
            carried.remove(key)
        else:
            carried.put(key, previous)

    def _unsafe(self, call: CallKnob, value: int, carried: _Carried, world: int) -> Optional[str]:
        """Why verl's worker would fail on ``value`` in this call (None: it will not)."""
        if call.tokens:
            floor = self.knobs[call.knob][1][1]
            if value < floor:
                return (f"{call.knob}={value} is below the longest sequence the run allows ({floor} tokens per GPU "
                        f"in {call.method}: verl's rearrange_micro_batches asserts max_token_len >= max_seq_len)")
            return None
        per_gpu = self._per_gpu(call, carried, world)
        if per_gpu is not None and per_gpu % value != 0:
            return (f"{call.knob}={value} does not divide the per-GPU {'mini-' if call.per == 'mini' else ''}batch "
                    f"of {per_gpu} in {call.method} (verl's worker would assert)")
        return None

    def _fallback(self, knob: str, refused: Optional[KnobChange]) -> int:
        return int(refused.old) if refused is not None else self._configured[knob]

    @staticmethod
    def _per_gpu(call: CallKnob, carried: _Carried, world: int) -> Optional[int]:
        total = carried.get("mini_batch_size") if call.per == "mini" else carried.size()
        if not isinstance(total, int) or world <= 0 or total % world:
            return None
        return total // world


class WorkerGroupProxy:
    """Stands in for one of the trainer's worker groups: the calls that carry a knob go through the applier,
    everything else straight to the real group."""

    def __init__(self, group: Any, calls: Mapping[str, CallKnob], applier: VerlKnobApplier):
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "_calls", dict(calls))
        object.__setattr__(self, "_applier", applier)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._group, name)
        call = self._calls.get(name)
        if call is None or not callable(attr):
            return attr

        def carried_call(data: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                undo = self._applier.carry(call, data, self._group)
            except Exception:  # never let trimtab break the call: it goes out as verl made it
                log.warning("trimtab: could not put %s into %s's data", call.knob, name, exc_info=True)
                undo = None
            try:
                return attr(data, *args, **kwargs)
            finally:
                try:
                    self._applier.restore(data, undo)
                except Exception:
                    log.warning("trimtab: could not restore %s's data after the call", name, exc_info=True)

        return carried_call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._group, name, value)


def wrap_worker_groups(trainer: Any, applier: VerlKnobApplier) -> Callable[[], None]:
    """Puts proxies in place of the trainer's worker groups that carry a declared knob; returns the undo."""
    by_group: dict[str, dict[str, CallKnob]] = {}
    for call, _, _ in applier.knobs.values():
        by_group.setdefault(call.group, {})[call.method] = call
    originals = {}
    for group_name, calls in by_group.items():
        group = getattr(trainer, group_name, None)
        if group is None:
            continue
        originals[group_name] = group
        setattr(trainer, group_name, WorkerGroupProxy(group, calls, applier))

    def undo() -> None:
        for group_name, group in originals.items():
            setattr(trainer, group_name, group)

    return undo
