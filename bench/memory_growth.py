"""A generation-bound job whose memory grows with its batch size, under the rebalancer (issue 15): does it end at
the largest batch that fits, without a CUDA OOM?

The job: a decode loop (``--decode-steps`` × ``--layers`` d×d bf16 matmuls over the batch — weight-bound, so a
step costs about the same at batch 1 and batch 40) and, per sample, a ``--per-sample-gib`` KV buffer filled each
step (an eighth of it: per-sample memory and a small per-sample cost): samples/s rise with the batch up to the memory it has. It
starts at batch 1, bounded by ``--batch-max`` (far above what fits), attached through trimtab's hook (mode auto,
allocator statistics every step) to a real `trimtab up` on loopback — NVML agent, SQLite, rebalancer — as
``bench/rebalance.py`` does. It runs until the rebalancer has had nothing to change for ``--tail`` steps, or
``--max-steps`` / ``--budget-s``.

Prints the batch sizes taken, each batch-size decision with its predicted and observed peak, whether a CUDA OOM
happened, and the final batch against the largest batch that fits — physically (the memory free at the start
less the measured base, over the measured per-sample slope) and under trimtab's memory line
(``memory_line_pct`` less ``memory_margin_pct`` of the GPU).

    python3 bench/memory_growth.py --device-map cuda:0                      # the lent H200 (< 5 min)
    python bench/memory_growth.py --device-map cpu --tiny                   # here: a simulated 141 GiB GPU

``--tiny`` on the CPU: small matrices, a 40 ms wait for the weight-bound decode, per-sample buffers of 4 MiB for
the work, and the memory the hook reports simulated — 2 GiB + ``--per-sample-gib`` per sample against ``--limit-gib`` — with an OOM raised (as
torch.cuda.OutOfMemoryError) when a batch would not fit. Nothing here needs a network beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

GIB = 2**30


@dataclass
class Step:
    step: int
    batch: int
    step_s: float
    peak_gib: Optional[float]   # the allocator's peak in this step (simulated with --tiny)
    oom: bool


class Job:
    """The decode loop and its per-sample buffers, on a GPU or (tiny) on the CPU with simulated memory."""

    def __init__(self, args):
        import torch

        self.torch = torch
        self.tiny = args.tiny
        self.device = torch.device(args.device_map)
        self.cuda = self.device.type == "cuda"
        dtype = torch.bfloat16 if self.cuda else torch.float32
        g = torch.Generator(device="cpu").manual_seed(0)
        self.weights = [(torch.randn(args.hidden, args.hidden, generator=g) / args.hidden ** 0.5).to(self.device, dtype)
                        for _ in range(args.layers)]
        self.hidden, self.decode_steps, self.dtype = args.hidden, args.decode_steps, dtype
        self.per_sample_bytes = int(args.per_sample_gib * GIB)
        self.work_bytes = 4 * 2**20 if self.tiny else self.per_sample_bytes  # what each sample's buffer holds
        # --tiny: the weight-bound decode of a GPU, as a wait (CPU matmuls this small cost only Python overhead)
        self.decode_wait_s = 0.04 if self.tiny else 0.0
        self.limit_bytes = int(args.limit_gib * GIB)
        self.base_sim_bytes = 2 * GIB
        self.free_at_start = torch.cuda.mem_get_info(self.device)[0] if self.cuda else self.limit_bytes
        self.total_bytes = torch.cuda.get_device_properties(self.device).total_memory if self.cuda else self.limit_bytes

    def simulated_peak(self, batch: int) -> int:
        return self.base_sim_bytes + batch * self.per_sample_bytes

    def generate(self, batch: int) -> None:
        torch = self.torch
        if self.tiny and self.simulated_peak(batch) > self.limit_bytes:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated): batch {batch} needs "
                                              f"{self.simulated_peak(batch) / GIB:.1f} GiB of {self.limit_bytes / GIB:.0f}")
        n = self.work_bytes // torch.tensor([], dtype=self.dtype).element_size()
        kv = [torch.empty(n, dtype=self.dtype, device=self.device) for _ in range(batch)]  # one per sequence
        for buf in kv:  # a decode step writes a slice of each sequence's cache: an eighth of it here
            buf.narrow(0, 0, n // 8).fill_(0.5)
        x = torch.randn(batch, self.hidden, device=self.device, dtype=self.dtype)
        for _ in range(self.decode_steps):
            for w in self.weights:
                x = torch.tanh(x @ w)
        if self.decode_wait_s:
            time.sleep(self.decode_wait_s)
        del kv
        self.sync()

    def update(self) -> None:
        w = self.weights[0]
        (w @ w.T).sum().item()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def peak_bytes(self, batch: int) -> Optional[int]:
        if self.tiny:
            return self.simulated_peak(batch)
        return self.torch.cuda.max_memory_allocated(self.device) if self.cuda else None


def fit_line(points: dict[int, float]) -> Optional[tuple[float, float]]:
    """(base, per-sample) of the peaks by batch size, least squares; None with fewer than two sizes."""
    if len(points) < 2:
        return None
    xs, ys = list(points), [points[b] for b in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device-map", "--device", dest="device_map", default="cuda:0", help="cuda:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="CPU sizes and a simulated GPU memory (see above)")
    ap.add_argument("--per-sample-gib", type=float, default=3.0)
    ap.add_argument("--limit-gib", type=float, default=141.0, help="--tiny: the simulated GPU's memory")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--decode-steps", type=int, default=None)
    ap.add_argument("--batch-max", type=int, default=256)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--tail", type=int, default=60, help="steps in a row with nothing to change that end the run")
    ap.add_argument("--daemon-args", default="--interval 1", help="extra `trimtab up` arguments")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep-state", action="store_true",
                    help="keep the daemon's state directory (store, log) instead of removing it at the end")
    args = ap.parse_args()
    small = args.tiny or args.device_map == "cpu"
    args.hidden = args.hidden or (128 if small else 8192)
    args.layers = args.layers or (2 if small else 8)
    args.decode_steps = args.decode_steps or (32 if small else 96)

    import torch

    from trimtab.grading.rules import default_rules
    from trimtab.trainer import attach
    from trimtab.workload import story

    if not args.tiny and args.device_map.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device-map cpu --tiny", file=sys.stderr)
        return 2
    if small:
        torch.set_num_threads(1)
    job_work = Job(args)
    daemon = story.start_daemon(args=args.daemon_args.split())
    print(f"trimtab up at {daemon.url} (state {daemon.state_dir}); {args.device_map}"
          f"{' (tiny, simulated memory)' if args.tiny else ''}; {args.per_sample_gib:g} GiB per sample", flush=True)
    steps: list[Step] = []
    name = f"memory-growth-{int(time.time())}"
    gpu = job_work.device.index if job_work.cuda else None
    try:
        hook = attach(job=name, server=daemon.url, token=daemon.token,
                      device_map={"actor": [gpu]} if gpu is not None else {},
                      knobs={"batch_size": (1, 1, args.batch_max)}, mode="auto", memory_every_s=1e-3)
        idle = story.rebalancer_idle(daemon, name)
        started, idle_since, next_check = time.monotonic(), None, 0.0
        while len(steps) < args.max_steps and time.monotonic() - started < args.budget_s:
            batch = int(hook.knobs["batch_size"])
            if job_work.cuda:
                torch.cuda.reset_peak_memory_stats(job_work.device)
            hook.step_begin()
            t0 = time.perf_counter()
            with hook.oom_guard():
                with hook.phase("generation"):
                    job_work.generate(batch)
            oom = hook.last_oom is not None
            if not oom:
                with hook.phase("update"):
                    job_work.update()
            peak = job_work.peak_bytes(batch) if not oom else None
            memory = None
            if args.tiny:
                memory = {"peak_allocated_bytes": peak or job_work.simulated_peak(1), "total_bytes": job_work.limit_bytes,
                          "num_ooms": hook.ooms}
            steps.append(Step(len(steps), batch, time.perf_counter() - t0, None if peak is None else peak / GIB, oom))
            hook.step_end(samples=0 if oom else batch, memory=memory)
            if oom:
                print(f"  step {len(steps) - 1}: OOM at batch {batch}: {hook.last_oom.error[:120]}", flush=True)
            now = time.monotonic()
            if now >= next_check:  # the daemon's health, twice a second
                idle_since = (len(steps) if idle_since is None else idle_since) if idle() else None
                next_check = now + 0.5
            if idle_since is not None and len(steps) - idle_since >= args.tail:
                break
        hook.close()
        print(f"hook: {hook.stats}", flush=True)  # reports sent/dropped: a step rate the reporter keeps up with
        decisions = story.api_get(daemon, f"/v1/decisions?job={name}&limit=200")["decisions"]
    finally:
        daemon.close(args.keep_state)

    path = []
    for s in steps:
        if not path or path[-1][0] != s.batch:
            path.append([s.batch, 0, s.step])
        path[-1][1] += 1
    print("\nbatch sizes taken: " + " → ".join(f"{b} ({n} steps from step {first})" for b, n, first in path))
    print("\n| id | change | applied at step | predicted GiB | observed GiB | error | verdict | outcome |")
    print("|---:|---|---:|---:|---:|---:|---|---|")
    for d in reversed(decisions):
        if d["knob"] != "batch_size":
            continue
        ev = d["evidence"]
        pred = (ev.get("memory_prediction") or {}).get("predicted_gib")
        seen = (ev.get("memory_observed") or {}).get("peak_gib")
        err = (ev.get("memory_observed") or {}).get("error_pct")
        v = ev.get("verdict") or {}
        fmt = lambda x: "" if x is None else f"{x:.1f}"  # noqa: E731
        print(f"| {d['id']} | {d['old_value']:g} → {d['new_value']:g} | {d['applied_step'] if d['applied_step'] is not None else ''} | "
              f"{fmt(pred)} | {fmt(seen)} | {'' if err is None else f'{err:+.1f} %'} | "
              f"{v.get('result', '')} {v.get('ratio', '')} | {d['outcome']} |")
    peaks: dict[int, float] = {}
    for s in steps[2:]:
        if s.peak_gib is not None and not s.oom:
            peaks[s.batch] = max(peaks.get(s.batch, 0.0), s.peak_gib * GIB)
    line = fit_line(peaks)
    ooms = sum(s.oom for s in steps)
    final = steps[-1].batch if steps else None
    ctl = default_rules().controller
    summary = {"device": args.device_map, "tiny": args.tiny, "steps": len(steps), "ooms": ooms,
               "batch_path": [b for b, _, _ in path], "final_batch": final,
               "seconds": round(time.monotonic() - started, 1)}
    if line is not None:
        base, slope = line
        fits = int((job_work.free_at_start - base) // slope) if not args.tiny else int((job_work.limit_bytes - base) // slope)
        under_line = int(((ctl.memory_line_pct - ctl.memory_margin_pct) / 100 * job_work.total_bytes - base)
                         // slope)
        summary.update(base_gib=round(base / GIB, 2), per_sample_gib=round(slope / GIB, 3), largest_fitting=fits,
                       largest_under_line=under_line)
        print(f"\nmeasured: {base / GIB:.2f} GiB + {slope / GIB:.3f} GiB per sample (peaks at batch sizes "
              f"{sorted(peaks)}); largest batch that fits: {fits} (free at start "
              f"{job_work.free_at_start / GIB:.1f} GiB); under trimtab's line ({ctl.memory_line_pct:g} % less "
              f"{ctl.memory_margin_pct:g} % of {job_work.total_bytes / GIB:.1f} GiB): {under_line}")
    print(f"final batch {final}; CUDA OOMs: {ooms}; {len(steps)} steps in {summary['seconds']} s")
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "decisions": decisions,
                                         "steps": [asdict(s) for s in steps]}, indent=1))
    return 0 if ooms == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
