"""Applying trimtab's ``batch_size`` knob inside verl, between steps, through verl's own trainer hooks.

verl reads these per call, so they are safe to change between steps (NOTES_VERL.md): every
``*micro_batch_size_per_gpu`` and, where ``use_dynamic_bsz`` is on, ``*max_token_len_per_gpu`` (dynamic batching
ignores the micro-batch size and packs by tokens, so the knob scales the token budget instead, in proportion to the
batch size it started from). ``data.train_batch_size``, ``gpu_memory_utilization``, gradient checkpointing and
offload need a restart: trimtab advises on those and never touches them. verl has no prefetch or sync-every knob
that is safe to change live, so only ``batch_size`` is mapped.

Example (verl installed; this module imports without it)::

    from verl.trainer.ppo.v1.trainer_sync import SyncTrainer           # the trainer you run today
    from verl.trainer.ppo.v1 import register_trainer                    # where your verl version defines it
    from trimtab.trainer.adapters.verl_knobs import TrimtabVerlMixin

    @register_trainer("trimtab_sync")
    class TrimtabSyncTrainer(TrimtabVerlMixin, SyncTrainer):             # the mixin first: it calls super()
        trimtab_job = "grpo-7b"
        trimtab_server = "http://head:9460"                             # token: $TRIMTAB_TOKEN
        trimtab_bounds = {"batch_size": (1, 64)}
        trimtab_sections = ("actor_rollout_ref.rollout", "actor_rollout_ref.ref")   # default: all of SECTIONS

    # launch with: trainer.v1.trainer_mode=trimtab_sync

The mixin runs in verl's driver process (one process: Ray's single controller), reports each step with the phases
of ``self.timing_raw`` and applies ``hook.knobs`` to ``self.config`` in ``on_step_end``. It must be confirmed on a
real verl run that the workers see the driver's config change for the call path in use (they do where the driver
passes the value in the batch's meta_info per call; a worker holding its own copy of the config would not).
"""

from __future__ import annotations

from typing import Any, Mapping, MutableMapping, Optional, Sequence

from trimtab.trainer.adapters.verl import verl_phases
from trimtab.trainer.hook import Hook, attach

SECTIONS = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic", "reward_model")
MICRO = "micro_batch_size_per_gpu"


def _child(node: Any, key: str) -> Any:
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def _has(node: Any, key: str) -> bool:
    return key in node if isinstance(node, Mapping) else hasattr(node, key)


def _keys(node: Any) -> list[str]:
    return list(node.keys()) if isinstance(node, Mapping) else [k for k in vars(node) if not k.startswith("_")]


def _set(node: Any, key: str, value: Any) -> None:
    if isinstance(node, MutableMapping):
        node[key] = value
    else:
        setattr(node, key, value)


def section(config: Any, dotted: str) -> Any:
    """``config.actor_rollout_ref.rollout`` for ``"actor_rollout_ref.rollout"`` (dict, DictConfig or object)."""
    node = config
    for part in dotted.split("."):
        node = _child(node, part) if node is not None else None
    return node


class _Target:
    """One micro-batch setting and, beside it, the dynamic-batching switch and token budget that go with it."""

    def __init__(self, path: str, node: Any, micro_key: str):
        prefix = micro_key[: -len(MICRO)]  # "ppo_", "log_prob_", "forward_" or "" (reward_model)
        self.path, self.node, self.micro_key = path, node, micro_key
        self.flag_key = next((k for k in (f"{prefix}use_dynamic_bsz", "use_dynamic_bsz") if _has(node, k)), None)
        self.tokens_key = next((k for k in (f"{prefix}max_token_len_per_gpu", "forward_max_token_len_per_gpu")
                                if _has(node, k) and _child(node, k) is not None), None)
        self.base_micro = _child(node, micro_key)
        self.base_tokens = _child(node, self.tokens_key) if self.tokens_key else None

    @property
    def dynamic(self) -> bool:
        return bool(self.flag_key and _child(self.node, self.flag_key)) and self.base_tokens is not None


class VerlKnobApplier:
    """Writes ``knobs["batch_size"]`` into a verl config (dict, OmegaConf DictConfig, or attribute object).

    Only keys that exist and are set are touched (never created: verl's struct-mode config refuses new keys).
    ``base_batch_size`` (default: the first micro-batch size found) is what token budgets scale from.
    """

    def __init__(self, config: Any, *, knob: str = "batch_size", sections: Sequence[str] = SECTIONS,
                 base_batch_size: Optional[int] = None):
        self.knob = knob
        self.targets: list[_Target] = []
        for dotted in sections:
            node = section(config, dotted)
            if node is None:
                continue
            for key in _keys(node):
                if key.endswith(MICRO) and isinstance(_child(node, key), int):
                    self.targets.append(_Target(f"{dotted}.{key}", node, key))
        micro = [t.base_micro for t in self.targets]
        self.base_batch_size = base_batch_size or (micro[0] if micro else None)

    def apply(self, knobs: Mapping[str, Any]) -> dict[str, int]:
        """Sets the config from ``knobs``; returns the dotted keys it changed and their new values."""
        batch_size = knobs.get(self.knob)
        if batch_size is None or not self.base_batch_size:
            return {}
        changed: dict[str, int] = {}
        for t in self.targets:
            if t.dynamic:
                key, value = t.tokens_key, max(1, round(t.base_tokens * batch_size / self.base_batch_size))
            else:
                key, value = t.micro_key, int(batch_size)
            if _child(t.node, key) != value:
                _set(t.node, key, value)
                changed[f"{t.path.rsplit('.', 1)[0]}.{key}"] = value
        return changed


class TrimtabVerlMixin:
    """Mix into a ``@register_trainer`` verl ``PPOTrainer`` subclass (see the module docstring)."""

    trimtab_job: Optional[str] = None  # default: trainer.experiment_name
    trimtab_server: Optional[str] = None  # None: standalone (no network)
    trimtab_token: Optional[str] = None  # default: $TRIMTAB_TOKEN
    trimtab_bounds: dict = {"batch_size": (1, 64)}
    trimtab_sections: Sequence[str] = SECTIONS
    trimtab_device_map: Optional[dict] = None
    trimtab_hook: Optional[Hook] = None

    def on_train_begin(self) -> None:
        super().on_train_begin()
        self._trimtab_applier = VerlKnobApplier(self.config, sections=self.trimtab_sections)
        lo, hi = self.trimtab_bounds["batch_size"]
        start = self._trimtab_applier.base_batch_size or lo
        job = self.trimtab_job or str(section(self.config, "trainer.experiment_name"))
        self.trimtab_hook = attach(job, self.trimtab_server, self.trimtab_token, device_map=self.trimtab_device_map,
                                   knobs={"batch_size": (start, lo, hi)})

    def on_step_end(self) -> None:
        super().on_step_end()
        if self.trimtab_hook is None:
            return
        self.trimtab_hook.step_end(samples=self.trimtab_samples_per_step(), step=getattr(self, "global_steps", None),
                                   phases_s=verl_phases(getattr(self, "timing_raw", None) or {}))
        self._trimtab_applier.apply(self.trimtab_hook.knobs)

    def on_train_end(self) -> None:
        super().on_train_end()
        if self.trimtab_hook is not None:
            self.trimtab_hook.close()

    def trimtab_samples_per_step(self) -> Optional[int]:
        """Prompts per step × responses per prompt; override where your recipe differs."""
        prompts = section(self.config, "data.train_batch_size")
        n = section(self.config, "actor_rollout_ref.rollout.n") or 1
        return prompts * n if isinstance(prompts, int) and isinstance(n, int) else None
