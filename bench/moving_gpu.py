"""The moving job on a GPU, for ``bench/moving_job.py --device-map cuda:N`` (or ``--live`` on the CPU: the same
path with the memory simulated and the decode a sleep — plumbing only).

Each step allocates the KV cache for real — one tensor of batch × length × ``kv_mib_per_token`` (bf16) — writes the
newest sixteenth of it, and decodes through 8 bf16 8192² layers (weight-bound: a step costs about the same at
batch 4 and batch 100; the number of decode iterations is calibrated at batch 64 to ``--step-s``). The job is
attached through trimtab's hook (mode auto, allocator statistics every step, peak from attach) to a real
`trimtab up` on loopback. After the run, with the daemon stopped: the best static batch (the largest that
runs at the longest length) and the oracle (the largest that runs at each step's length) are found by running
steps for real, and their throughput is measured on every ``--baseline-every``-th step of the same schedule.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from bench.moving_job import GIB, MIB, Run, Shape, largest_fitting, print_path, report


class DecodeJob:
    def __init__(self, device_map: str, shape: Shape, step_s: float):
        import torch

        self.torch, self.shape = torch, shape
        self.device = torch.device(device_map)
        self.cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        hidden, layers = (8192, 8) if self.cuda else (64, 2)
        g = torch.Generator(device="cpu").manual_seed(0)
        self.weights = [(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5).to(self.device, self.dtype)
                        for _ in range(layers)]
        self.hidden = hidden
        self.per_token_elems = int(shape.kv_mib_per_token * MIB) // 2
        # --live on the CPU: 141 GiB simulated, 2 GiB of it the model's; the decode is a sleep of step_s
        self.limit_bytes, self.base_bytes = 141 * GIB, 2 * GIB
        self.total_bytes = torch.cuda.get_device_properties(self.device).total_memory if self.cuda else self.limit_bytes
        self.step_s, self.iters = step_s, 1
        if self.cuda:
            self.iters = max(1, round(step_s / self._iteration_s(64)))

    def _iteration_s(self, batch: int) -> float:
        torch = self.torch
        x = torch.randn(batch, self.hidden, device=self.device, dtype=self.dtype)
        for _ in range(3):
            self._layers(x)
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        for _ in range(20):
            self._layers(x)
        torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) / 20

    def _layers(self, x):
        for w in self.weights:
            x = self.torch.tanh(x @ w)
        return x

    def simulated_peak(self, batch: int, length: int) -> int:
        return self.base_bytes + batch * length * int(self.shape.kv_mib_per_token * MIB)

    def step(self, batch: int, length: int, iters: Optional[int] = None) -> None:
        torch = self.torch
        if not self.cuda:
            if self.simulated_peak(batch, length) > self.limit_bytes:
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated): batch {batch} at {length} tokens")
            time.sleep(self.step_s if iters is None else 0.0)
            return
        kv = torch.empty((batch, length, self.per_token_elems), dtype=self.dtype, device=self.device)
        kv[:, -max(1, length // 16):, :].fill_(0.5)  # this step's tokens written into each sequence's cache
        x = torch.randn(batch, self.hidden, device=self.device, dtype=self.dtype)
        for _ in range(self.iters if iters is None else iters):
            x = self._layers(x)
        del kv
        torch.cuda.synchronize(self.device)

    def fits(self, batch: int, length: int) -> bool:
        """A real step (one decode iteration) at ``batch`` and ``length`` runs without an OOM."""
        from trimtab.trainer.memory import is_oom

        try:
            self.step(batch, length, iters=1)
            return True
        except Exception as exc:
            if not is_oom(exc):
                raise
            if self.cuda:
                self.torch.cuda.empty_cache()
            return False

    def timed(self, batch: int, length: int) -> float:
        t0 = time.perf_counter()
        self.step(batch, length)
        return time.perf_counter() - t0


def lengths_of(shape: Shape) -> list[int]:
    return [round(shape.start_tokens + (shape.end_tokens - shape.start_tokens) * i / max(1, shape.steps - 1))
            for i in range(shape.steps)]


def run_gpu(args, shape: Shape) -> int:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # a cache that grows in place
    import torch

    from trimtab.trainer import attach
    from trimtab.workload import story

    if args.device_map.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device-map cpu", flush=True)
        return 2
    if not args.device_map.startswith("cuda"):
        torch.set_num_threads(1)
    job = DecodeJob(args.device_map, shape, args.step_s)
    lengths = lengths_of(shape)
    daemon = story.start_daemon(args=["--interval", "1"])
    print(f"trimtab up at {daemon.url}; {args.device_map}; {job.iters} decode iterations a step; "
          f"{shape.kv_mib_per_token:g} MiB per token per sample; {shape.start_tokens} → {shape.end_tokens} tokens "
          f"over {shape.steps} steps; total {job.total_bytes / GIB:.1f} GiB", flush=True)
    name = f"moving-{int(time.time())}"
    gpu = job.device.index if job.cuda else None
    run = Run()
    started = time.monotonic()
    try:
        hook = attach(job=name, server=daemon.url, token=daemon.token,
                      device_map={"actor": [gpu]} if gpu is not None else {},
                      knobs={"batch_size": (shape.batch_start, 1, shape.batch_max)}, mode="auto", memory_every_s=1e-3)
        for i, length in enumerate(lengths):
            if time.monotonic() - started > args.budget_s:
                print(f"time budget {args.budget_s:g} s reached at step {i}", flush=True)
                break
            batch = int(hook.knobs["batch_size"])
            hook.step_begin()
            t0 = time.perf_counter()
            with hook.oom_guard():
                with hook.phase("generation"):
                    job.step(batch, length)
            lost = hook.last_oom is not None
            if not lost:
                with hook.phase("update"):
                    job._layers(torch.randn(4, job.hidden, device=job.device, dtype=job.dtype)).sum().item()
            memory = None
            if not job.cuda:
                memory = {"peak_allocated_bytes": job.simulated_peak(batch, length), "total_bytes": job.limit_bytes,
                          "num_ooms": hook.ooms}
            run.batches.append(batch)
            run.lengths.append(length)
            run.seconds.append(time.perf_counter() - t0)
            run.samples.append(0 if lost else batch)
            if lost:
                run.ooms.append(i)
                print(f"  step {i}: OOM at batch {batch}, {length} tokens: {hook.last_oom.error[:100]}", flush=True)
            hook.step_end(samples=0 if lost else batch, tokens=0 if lost else batch * length, memory=memory)
            if i % 25 == 0:
                print(f"  step {i}: {length} tokens, batch {batch}, {run.seconds[-1]:.3f} s", flush=True)
        hook.close()
        print(f"hook: {hook.stats}", flush=True)
        run.decisions = story.api_get(daemon, f"/v1/decisions?job={name}&limit=200")["decisions"]
    finally:
        daemon.close()
    auto_s = time.monotonic() - started
    lengths = run.lengths  # the steps that ran
    if job.cuda:
        torch.cuda.empty_cache()
    static = largest_fitting(job.fits, max(lengths), shape.batch_max)
    oracle, b = [], largest_fitting(job.fits, lengths[0], shape.batch_max)
    for length in lengths:
        while b > 0 and not job.fits(b, length):
            b -= 1
        oracle.append(b)
    sampled = list(range(0, len(lengths), args.baseline_every))
    static_s = [job.timed(static, lengths[i]) for i in sampled]
    oracle_s = [job.timed(oracle[i], lengths[i]) for i in sampled]
    base = {"static_batch": static, "static_samples_per_s": static * len(sampled) / sum(static_s),
            "oracle_batches": oracle, "oracle_samples_per_s": sum(oracle[i] for i in sampled) / sum(oracle_s)}
    out = report(run, base, f"{args.device_map} moving job")
    print_path(out)
    out.update(device=args.device_map, steps=len(run.batches), auto_s=round(auto_s, 1),
               static_step_s=round(sum(static_s) / len(static_s), 3),
               oracle_step_s=round(sum(oracle_s) / len(oracle_s), 3), total_gib=round(job.total_bytes / GIB, 1),
               kv_mib_per_token=shape.kv_mib_per_token, decode_iterations=job.iters,
               mean_step_s=round(sum(run.seconds) / len(run.seconds), 3))
    print(json.dumps({k: v for k, v in out.items() if k not in ("path", "decisions")}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if not run.ooms and out["of_static_pct"] >= args.goal_pct else 1
