"""The reference pipeline, data parallel: WORLD_SIZE processes, each a :class:`Pipeline` on its own device map, whose
actor and critic gradients are averaged over the ranks after every backward pass (DDP semantics: averaged before
the gradient clip and the optimizer step, so every rank takes the same step and the replicas stay identical).

    torchrun --nproc-per-node 2 -m trimtab.workload.ddp --config h200 \\
        --device-map 'actor=0,1;ref=0,1;critic=2;reward=3' --steps 20 --server URL --token T --mode auto

Device maps. A *job* map (``--device-map``, ``component=devices;…`` or JSON) lists, per component, the devices of the
whole job; ``actor`` lists the data-parallel ranks' devices, one per rank (unlike the single-process pipeline,
where ``actor=0,1`` means "train on 0, generate on 1"). :func:`split_job_map` gives rank *r* the *r*-th device of
a component that has one per rank, and ``devices[r % n]`` of one that has fewer (shared: in
``actor=0,1;ref=0,1;critic=2;reward=3`` the critic on GPU 2 and reward on GPU 3 serve both ranks, each rank with its
own replica). ``--rank-maps`` takes the per-rank maps
as a JSON list instead. Unnamed components follow :func:`~trimtab.workload.config.parse_device_map`: the
generation copy on the rank's actor device, the rest with the actor.

What differs between ranks, and what may not: every rank builds its models from the same ``config.seed`` (same
initial weights, same task rule, same reward model — rank 0's are broadcast anyway, so a GPU's non-determinism
cannot split them), and rank *r* > 0 draws its prompts and samples from seeds offset by ``r ×``
:data:`RANK_SEED_STRIDE` (rank 0 sees exactly what the single-process pipeline sees). Data parallel means: each
rank generates and scores its own ``samples_per_step`` samples; the job does ``world × samples_per_step`` a step.

Gradient averaging (:class:`GradAverager`): a post-accumulate-grad hook on every trainable parameter counts the
parameters whose gradient is complete; when the module's last one arrives, its gradients are flattened in buckets,
moved to the rank's *home* device (the actor's: where the NCCL communicator of this rank lives — two ranks'
critics on one GPU could not share a communicator), all-reduced, divided by the world size and copied back. No
change to ``loop.py`` or ``ppo.py`` is needed. If a backward pass ever leaves a parameter without a gradient, an
optimizer step pre-hook reduces what is pending before the step (then after the clip: said once in the log).

The knob hook is the usual ``trimtab.trainer.attach`` on every rank after ``init_process_group``: knob changes are
agreed at the same step on every rank (gloo MIN all-reduce), each rank acknowledges, and ``probe_every`` runs the
all-reduce latency probe on the job's own group (NCCL on CUDA). The gradient all-reduce runs inside the "update"
phase; ``sync_every`` still governs the weight sync into each rank's generation copy ("communication").
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .config import COMPONENTS, DeviceMap, PipelineConfig, parse_pairs, parse_device_map
from .loop import Pipeline

log = logging.getLogger("trimtab.workload.ddp")

RANK_SEED_STRIDE = 1_000_000_007   # rank r > 0: prompt and sampling seeds offset by r × this (steps never reach it)
# NVLink multicast (NVLS) off: the lent machines require it (a program using it can take shared GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_ANY_GPU = 1 << 16   # parse_device_map's visible-device check, off: maps may name GPUs of another machine


def apply_safe_env(env: Optional[dict] = None) -> dict:
    """Set :data:`SAFE_ENV` in ``env`` (default ``os.environ``), overriding: it must hold before NCCL starts."""
    env = os.environ if env is None else env
    env.update(SAFE_ENV)
    return env


# -- device maps ----------------------------------------------------------------------------------------------------

def _devices_of(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def parse_job_map(text: str, world: Optional[int] = None) -> dict[str, list]:
    """``cpu`` / ``cuda`` (with ``world``: every rank on that kind), JSON ``{"actor": [0, 1], ...}`` or
    ``actor=0,1;critic=2;reward=3;ref=0,1`` → component → devices of the whole job."""
    text = (text or "").strip()
    if text in ("cpu", "cuda"):
        n = world or 1
        return {"actor": ["cpu"] * n if text == "cpu" else list(range(n))}
    if text.startswith("{"):
        declared = {k: _devices_of(v) for k, v in json.loads(text).items()}
    elif "=" in text:
        declared = parse_pairs(text)
    else:
        raise ValueError(f"job device map {text!r}: give cpu, cuda, JSON or 'actor=0,1;critic=2;…'")
    unknown = set(declared) - set(COMPONENTS)
    if unknown or "actor" not in declared or any(not v for v in declared.values()):
        raise ValueError(f"job device map needs an 'actor' list and components from {COMPONENTS}, got "
                         f"{sorted(declared)}")
    return {k: [int(d) if isinstance(d, str) and d.strip().isdigit() else d for d in v] for k, v in declared.items()}


def split_job_map(job_map: Mapping[str, Sequence], world: Optional[int] = None) -> list[dict[str, list]]:
    """Per-rank maps: a component with one device per rank gets rank r's; one with fewer is shared
    (``devices[r % n]``). ``world`` defaults to the number of actor devices, which must equal it."""
    actor = _devices_of(job_map.get("actor") or [])
    world = world if world is not None else len(actor)
    if world < 1 or len(actor) != world:
        raise ValueError(f"the actor's devices are the data-parallel ranks: {len(actor)} actor device(s) for "
                         f"{world} rank(s)")
    out = []
    for rank in range(world):
        out.append({c: [_devices_of(devs)[rank % len(_devices_of(devs))]] for c, devs in job_map.items()})
    return out


def rank_device_map(rank_map: Mapping[str, Sequence] | str, cuda_count: Optional[int] = None) -> DeviceMap:
    """One rank's :class:`DeviceMap` (defaults as in ``parse_device_map``)."""
    text = rank_map if isinstance(rank_map, str) else json.dumps({k: _devices_of(v) for k, v in rank_map.items()})
    return parse_device_map(text, cuda_count=cuda_count)


def hook_map(rank_maps: Sequence[Mapping[str, Sequence] | str]) -> dict[str, list[int]]:
    """The job's GPU indices per component, the union over ranks, as ``attach(device_map=...)`` declares it (CPU
    placements left out; defaults applied, so the generation copy appears as ``rollout``)."""
    union: dict[str, set[int]] = {}
    for m in rank_maps:
        for name, gpus in rank_device_map(m, cuda_count=_ANY_GPU).as_hook_map().items():
            union.setdefault(name, set()).update(gpus)
    return {name: sorted(gpus) for name, gpus in sorted(union.items())}


# -- collectives on the rank's home device --------------------------------------------------------------------------

def _buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (device, dtype), each group cut into buckets of ≤ ``bucket_bytes``
    (a larger tensor alone); order kept, so every rank forms the same buckets."""
    groups: dict[tuple, list[list[int]]] = {}
    sizes: dict[tuple, int] = {}
    order: list[tuple] = []
    for i, t in enumerate(tensors):
        key = (t.device, t.dtype)
        if key not in groups:
            groups[key], sizes[key] = [[]], 0
            order.append(key)
        nbytes = t.numel() * t.element_size()
        if groups[key][-1] and sizes[key] + nbytes > bucket_bytes:
            groups[key].append([])
            sizes[key] = 0
        groups[key][-1].append(i)
        sizes[key] += nbytes
    return [b for key in order for b in groups[key]]


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


@torch.no_grad()
def _scatter_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    for t, chunk in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(chunk.view_as(t))


@torch.no_grad()
def broadcast_modules(modules: Iterable[nn.Module], home: torch.device, group=None, src: int = 0,
                      bucket_bytes: int = 256 << 20) -> int:
    """Every parameter and buffer of ``modules`` from rank ``src`` to all ranks, staged through ``home`` (the
    device this rank's communicator uses). Collective. Returns the bytes broadcast."""
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    total = 0
    for bucket in _buckets(tensors, bucket_bytes):
        group_tensors = [tensors[i] for i in bucket]
        flat = _flatten(group_tensors)
        staged = flat.to(home)
        dist.broadcast(staged, src=src, group=group)
        _scatter_back(staged.to(flat.device), group_tensors)
        total += staged.numel() * staged.element_size()
    return total


@dataclass
class _ModuleGrads:
    index: int
    params: list[nn.Parameter]
    pending: int = 0
    handles: list = field(default_factory=list)


class GradAverager:
    """Averages the gradients of ``modules`` over ``group`` as soon as a backward pass completes them (see the
    module docstring). ``probe_dirs`` > 0 (tests): keep, per module, the projections of the latest local and
    averaged gradient on that many fixed random directions, so a test can check avg = mean(local) across ranks.

    Counters: ``reductions`` (module-backward passes reduced), ``bytes_reduced`` (payload per rank),
    ``late_flushes`` (reductions the optimizer pre-hook had to do)."""

    def __init__(self, modules: Sequence[nn.Module], home: torch.device, group=None,
                 bucket_bytes: int = 256 << 20, probe_dirs: int = 0):
        self.home, self.group, self.bucket_bytes, self.probe_dirs = torch.device(home), group, bucket_bytes, probe_dirs
        self.world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        self.reductions = 0
        self.bytes_reduced = 0
        self.late_flushes = 0
        self.projections: dict[int, dict[str, list[float]]] = {}
        self._states: list[_ModuleGrads] = []
        self._opt_handles: list = []
        for index, module in enumerate(modules):
            state = _ModuleGrads(index, [p for p in module.parameters() if p.requires_grad])
            for p in state.params:
                state.handles.append(p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, state)))
            self._states.append(state)

    def guard(self, optimizer: torch.optim.Optimizer) -> None:
        """Before ``optimizer.step()``, reduce whatever a backward pass left pending (a parameter without grad)."""
        self._opt_handles.append(optimizer.register_step_pre_hook(lambda *_: self.flush()))

    def _on_grad(self, state: _ModuleGrads, _param: torch.Tensor) -> None:
        state.pending += 1
        if state.pending >= len(state.params):
            self._reduce(state)

    def flush(self) -> None:
        for state in self._states:
            if state.pending:
                if not self.late_flushes:
                    log.warning("trimtab ddp: a backward pass left %d of %d parameters of module %d without a "
                                "gradient; reduced before the optimizer step (after the clip)", len(state.params) -
                                state.pending, len(state.params), state.index)
                self.late_flushes += 1
                self._reduce(state)

    @torch.no_grad()
    def _reduce(self, state: _ModuleGrads) -> None:
        state.pending = 0
        grads = [p.grad for p in state.params if p.grad is not None]
        if self.world == 1 or not grads:
            return
        local_proj, avg_proj = [], []
        for b, bucket in enumerate(_buckets(grads, self.bucket_bytes)):
            tensors = [grads[i] for i in bucket]
            flat = _flatten(tensors)
            dirs = self._dirs(b, flat) if self.probe_dirs else None
            if dirs is not None:
                local_proj.append(dirs @ flat.double().cpu())
            staged = flat.to(self.home)
            dist.all_reduce(staged, group=self.group)
            staged.div_(self.world)
            back = staged.to(flat.device)
            if dirs is not None:
                avg_proj.append(dirs @ back.double().cpu())
            _scatter_back(back, tensors)
            self.bytes_reduced += staged.numel() * staged.element_size()
        self.reductions += 1
        if self.probe_dirs:
            self.projections[state.index] = {"local": torch.stack(local_proj).sum(0).tolist(),
                                             "averaged": torch.stack(avg_proj).sum(0).tolist()}

    def _dirs(self, bucket: int, flat: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(1234 + bucket)
        return torch.randn(self.probe_dirs, flat.numel(), generator=gen, dtype=torch.float64)

    @property
    def stats(self) -> dict:
        return {"world": self.world, "reductions": self.reductions, "bytes_reduced": self.bytes_reduced,
                "late_flushes": self.late_flushes}

    def remove(self) -> None:
        for state in self._states:
            for h in state.handles:
                h.remove()
            state.handles.clear()
        for h in self._opt_handles:
            h.remove()
        self._opt_handles.clear()


# -- the pipeline ---------------------------------------------------------------------------------------------------

class DataParallelPipeline(Pipeline):
    """A :class:`Pipeline` that is one rank of a data-parallel job. ``torch.distributed`` must be initialised
    (gloo on CPU, NCCL on CUDA with ``torch.cuda.set_device`` = the actor's device). ``group``: the data-parallel
    group (default: the world); ``bucket_mb``: gradient all-reduce bucket size; ``broadcast``: copy rank 0's
    initial weights everywhere (default on); ``probe_dirs``: see :class:`GradAverager`."""

    def __init__(self, config: PipelineConfig, device_map: DeviceMap | str | None = None, knobs=None, hook=None,
                 log: Optional[Callable[[str], None]] = None, *, group=None, bucket_mb: float = 256,
                 broadcast: bool = True, probe_dirs: int = 0):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("DataParallelPipeline: call torch.distributed.init_process_group first")
        self.dp_group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._bucket_bytes = int(bucket_mb * (1 << 20))
        self._broadcast = broadcast
        self._probe_dirs = probe_dirs
        self.grads: Optional[GradAverager] = None
        self.data_seed_offset = self.rank * RANK_SEED_STRIDE  # rank 0 sees what the single-process pipeline sees
        super().__init__(config, device_map, knobs=knobs, hook=hook, log=log)

    @property
    def home(self) -> torch.device:
        return self.devices.actor

    def _build_models(self) -> None:
        super()._build_models()
        if self.home.type == "cuda" and "nccl" not in str(dist.get_backend(self.dp_group)):
            raise RuntimeError("a CUDA actor needs the nccl backend (gloo here would reduce through the host)")
        if self.world > 1 and self._broadcast:
            broadcast_modules([self.actor, self.critic, self.reward_model, self.ref, self.generation_model],
                              self.home, self.dp_group, bucket_bytes=self._bucket_bytes)
        self.grads = GradAverager([self.actor, self.critic], self.home, self.dp_group, self._bucket_bytes,
                                  self._probe_dirs)
        self.grads.guard(self.actor_opt)
        self.grads.guard(self.critic_opt)

    def close(self) -> None:
        super().close()
        if self.grads is not None:
            self.grads.remove()


def init_distributed(devices: DeviceMap, init_method: Optional[str] = None, rank: Optional[int] = None,
                     world_size: Optional[int] = None, timeout_s: float = 600.0) -> str:
    """``init_process_group`` for a rank whose actor is on ``devices.actor``: NCCL (multicast off, this GPU set
    current) on CUDA, gloo on CPU. Without arguments it reads torchrun's environment. Returns the backend."""
    import datetime

    backend = "nccl" if devices.actor.type == "cuda" else "gloo"
    if backend == "nccl":
        apply_safe_env()
        torch.cuda.set_device(devices.actor)
    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=world_size)
    dist.init_process_group(backend, **kwargs)
    return backend


def params_digest(module: nn.Module) -> str:
    """A hash of every parameter's bytes: equal on two ranks iff their replicas are bit-identical."""
    import hashlib

    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# -- torchrun entry point -------------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    from trimtab.trainer import attach

    from .cli import build_parser, knob_declaration, summarize
    from .config import Knobs, preset
    from .loop import set_cpu_threads

    parser = build_parser()
    parser.prog = "torchrun --nproc-per-node N -m trimtab.workload.ddp"
    parser.description = __doc__
    parser.add_argument("--rank-maps", default=None, help="JSON list of per-rank device maps (instead of splitting "
                                                          "--device-map)")
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    maps = (json.loads(args.rank_maps) if args.rank_maps
            else split_job_map(parse_job_map(args.device_map or "cpu", world), world))
    if len(maps) != world:
        raise SystemExit(f"{len(maps)} rank maps for WORLD_SIZE {world}")
    devices = rank_device_map(maps[rank])
    init_distributed(devices)
    overrides = {k: v for k, v in (("sync_via", args.sync_via), ("samples_per_step", args.samples_per_step),
                                   ("seed", args.seed)) if v is not None}
    config = preset(args.config, **overrides)
    threads = set_cpu_threads(devices, args.cpu_threads)
    start = Knobs.read({"batch_size": args.batch_size, "prefetch": args.prefetch, "sync_every": args.sync_every})
    hook = attach(job=args.job, server=args.server, token=args.token, device_map=hook_map(maps),
                  knobs=knob_declaration(start, config.samples_per_step), mode=args.mode)
    say = (lambda line: print(f"rank {rank}: {line}", flush=True))
    say(f"config {config.name}: {devices}; world {world}; {threads} CPU threads")
    try:
        with DataParallelPipeline(config, devices, hook=hook, log=say) as pipeline:
            show = None if args.quiet else (lambda record: say(record.line()))
            records = pipeline.run(args.steps, show)
            digest = params_digest(pipeline.actor)
            grads = pipeline.grads.stats
    finally:
        hook.close()
    summary = summarize(records)
    say(f"summary: {summary['samples_per_s']:.1f} samples/s on this rank ({summary['steady_samples_per_s']:.1f} after "
        f"step 0); actor digest {digest[:16]}; gradient all-reduces {grads['reductions']} "
        f"({grads['bytes_reduced'] / 2**30:.2f} GiB)")
    if args.json_path is not None:
        path = Path(str(args.json_path).replace("{rank}", str(rank)))
        path.write_text(json.dumps({"rank": rank, "world": world, "device_map": str(devices), "summary": summary,
                                    "actor_digest": digest, "grads": grads,
                                    "records": [r.as_dict() for r in records]}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
