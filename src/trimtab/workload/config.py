"""What `--config`, the three knob flags and `--device-map` mean: model sizes, PPO settings, knob defaults and bounds.

The work of one step is fixed in *samples* (``samples_per_step``) and the PPO minibatch is fixed too, so the knobs
change only how that work is scheduled — which is what makes samples/s comparable across knob settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    n_layers: int
    n_heads: int

    def __str__(self) -> str:
        return f"d{self.d_model}×{self.n_layers}L×{self.n_heads}H"


@dataclass(frozen=True)
class PipelineConfig:
    """One named size of the whole job; fields are per step unless they say otherwise."""

    name: str
    vocab_size: int
    prompt_tokens: int
    response_tokens: int
    actor: ModelSize                  # the reference and the generation copy have the actor's size
    critic: ModelSize
    reward: ModelSize
    samples_per_step: int             # fixed work per step, whatever the knobs say
    train_micro_batch: int            # PPO minibatch in samples; independent of the generation batch knob
    ppo_epochs: int = 1
    actor_lr: float = 1e-4
    critic_lr: float = 1e-4
    kl_coef: float = 0.02             # per-token KL(behaviour ‖ reference) subtracted from the reward
    clip_ratio: float = 0.2
    gamma: float = 1.0
    gae_lambda: float = 0.95
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    good_token_fraction: float = 0.25  # the task: this share of the vocabulary is "good"
    reward_pretrain_steps: int = 100
    reward_pretrain_batch: int = 64
    reward_lr: float = 3e-3
    # "host": trained weights reach the generation copy through pinned host memory, as when the generation engine
    # lives in another process or node; "direct": a device-to-device copy (same or peer GPU, or CPU).
    sync_via: str = "direct"
    # Bounded staleness (one-step off-policy PPO, as verl's one_step_off_policy recipe: 1). A generated batch more
    # than this many actor updates behind the policy it would train is generated again, from the same prompts, with
    # the current generation copy — work done twice, which is what deeper prefetch then costs. None: no bound.
    max_staleness: int | None = None
    # Report the trainer's wait for scored samples as the "wait" phase (the rollout_wait_bound rule's signal), as a
    # trainer fed by a separate rollout service does. Off by default: the benchmarks were measured without it.
    report_wait: bool = False
    seed: int = 0

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens


TINY = PipelineConfig(
    name="tiny", vocab_size=64, prompt_tokens=8, response_tokens=16,
    actor=ModelSize(64, 2, 4), critic=ModelSize(32, 1, 2), reward=ModelSize(32, 1, 2),
    samples_per_step=64, train_micro_batch=32, actor_lr=2e-3, critic_lr=2e-3, reward_pretrain_steps=80,
)

# Sized so the update and scoring keep one H200 busy, while eager decoding stays launch-bound (the GPU waits on the
# CPU for every token) up to batch 64: generation throughput then grows almost with the batch, as in real rollouts.
H200 = PipelineConfig(
    name="h200", vocab_size=8192, prompt_tokens=256, response_tokens=128,
    actor=ModelSize(2048, 12, 16), critic=ModelSize(1024, 8, 8), reward=ModelSize(1024, 8, 8),
    samples_per_step=64, train_micro_batch=16, actor_lr=3e-5, critic_lr=3e-5,
    reward_pretrain_steps=60, reward_pretrain_batch=32, reward_lr=1e-3, sync_via="host",
)

# The tiny models with longer responses, so on a CPU decoding dominates a step as it does on a GPU (with 16
# response tokens a CPU step is mostly Python overhead and the batch-size story stops at batch 4).
CPU = replace(TINY, name="cpu", response_tokens=48)
# `trimtab demo`: the CPU config, one-step off-policy, its trainer reporting its wait for rollout — so the prefetch
# knob has a rule that asks for it and a depth that costs more than it gains. ("demo" had no bound before: a
# benchmark of the old behaviour runs --config cpu.)
DEMO = replace(CPU, name="demo", max_staleness=1, report_wait=True)

# The bench scripts' smoke runs in the test suite (tests/bench/test_smoke.py): the tiny models on a quarter of the
# samples and a reward model barely pretrained, so a script's whole path runs in seconds; its figures mean nothing.
SMOKE = replace(TINY, name="smoke", samples_per_step=16, train_micro_batch=8, reward_pretrain_steps=4)

PRESETS = {"tiny": TINY, "h200": H200, "cpu": CPU, "demo": DEMO, "smoke": SMOKE}


def preset(name: str, **overrides) -> PipelineConfig:
    """A named config with fields replaced (``preset("tiny", samples_per_step=16)``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown config {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


# Deliberately bad settings, for the rebalancer to fix: one sample per generation call, no prefetch, sync after
# every step.
DEFAULT_KNOBS = {"batch_size": 1, "prefetch": 0, "sync_every": 1}
KNOB_BOUNDS = {"batch_size": (1, 1024), "prefetch": (0, 8), "sync_every": (1, 8)}


@dataclass(frozen=True)
class Knobs:
    batch_size: int = DEFAULT_KNOBS["batch_size"]
    prefetch: int = DEFAULT_KNOBS["prefetch"]
    sync_every: int = DEFAULT_KNOBS["sync_every"]

    @classmethod
    def read(cls, mapping) -> "Knobs":
        """Take the three knobs from any mapping (``hook.knobs``, a dict), checked against the job-side bounds."""
        values = {}
        for name, (low, high) in KNOB_BOUNDS.items():
            value = int(mapping[name])
            if not low <= value <= high:
                raise ValueError(f"knob {name}={value} outside [{low}, {high}]")
            values[name] = value
        return cls(**values)


COMPONENTS = ("actor", "rollout", "ref", "reward", "critic")


@dataclass(frozen=True)
class DeviceMap:
    """Where each component runs. ``rollout`` is the generation copy of the actor."""
    actor: torch.device
    rollout: torch.device
    ref: torch.device
    reward: torch.device
    critic: torch.device

    def __str__(self) -> str:
        return ", ".join(f"{name} {getattr(self, name)}" for name in COMPONENTS)

    def as_hook_map(self) -> dict[str, list[int]]:
        """GPU indices per component, as ``trimtab.trainer.attach(device_map=...)`` takes them (CPU ones left out)."""
        return {name: [getattr(self, name).index or 0] for name in COMPONENTS
                if getattr(self, name).type == "cuda"}


def _device(value, cuda_count: int) -> torch.device:
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        device = torch.device("cuda", int(value))
    else:
        device = torch.device(str(value).strip())
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
    if device.type == "cuda" and device.index >= cuda_count:
        raise ValueError(f"device {device} requested but {cuda_count} CUDA device(s) visible")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device}")
    return device


def parse_pairs(text: str) -> dict[str, list]:
    """``actor=0,1;critic=2;reward=3;ref=0`` → {"actor": ["0", "1"], ...}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, devices = part.partition("=")
        if not sep:
            raise ValueError(f"device map entry {part!r} is not name=devices")
        out[name.strip()] = [d for d in devices.split(",") if d.strip()]
    return out


def parse_device_map(text: str | None, cuda_count: int | None = None) -> DeviceMap:
    """Read ``--device-map``: empty (cuda:0 if present, else cpu), one device for all (``cpu``, ``cuda:0``, ``0``),
    JSON (``{"actor": [0, 1], "critic": [2]}``) or ``actor=0,1;critic=2;reward=3;ref=0``.

    The actor's first device trains it; the generation copy goes to ``rollout`` if named, else to the actor's last
    device (so ``actor=0,1`` trains on GPU 0 and generates on GPU 1). Unnamed components join the actor's first.
    """
    cuda_count = torch.cuda.device_count() if cuda_count is None else cuda_count
    text = (text or "").strip()
    if not text:
        text = "cuda:0" if cuda_count else "cpu"
    if text.startswith("{"):
        declared = {k: v if isinstance(v, list) else [v] for k, v in json.loads(text).items()}
    elif "=" in text:
        declared = parse_pairs(text)
    else:
        declared = {"actor": [text]}
    unknown = set(declared) - set(COMPONENTS)
    if unknown or any(not v for v in declared.values()):
        raise ValueError(f"device map names {sorted(unknown) or 'an empty list'}; components are {COMPONENTS}")
    actor = [_device(v, cuda_count) for v in declared.get("actor", ["cuda:0" if cuda_count else "cpu"])]

    def first(name: str, fallback: torch.device) -> torch.device:
        return _device(declared[name][0], cuda_count) if name in declared else fallback

    return DeviceMap(actor=actor[0], rollout=first("rollout", actor[-1]), ref=first("ref", actor[0]),
                     reward=first("reward", actor[0]), critic=first("critic", actor[0]))
