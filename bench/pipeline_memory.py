"""What the memory rule reads against what the job needs: the reference pipeline at fixed knobs for many steps, with
the GPU's memory as the agent reads it (NVML used + reserved over total, the ``mem_used_pct`` that ``[rules.memory]``
halves the batch above 98 %) beside torch's own figures (the allocator's peak since the last line, what it holds
allocated and what it keeps reserved).

Why: on the lent H100 (80 GB) the reference pipeline at 64/2/4 with the ``h200`` config ran ~340 steps and then the
memory rule asked for batch 64 → 32 (2026-12-06, 30cd766). If NVML's figure climbs while the allocator's peak stays
flat, the rule read the caching allocator's cache, not the job's need; if the peak climbs too, the job is near its
limit and halving was right.

    python3 bench/pipeline_memory.py --config h200 --device-map cuda:0 --knobs 64,2,4 --steps 360 --every 20
    python3 bench/pipeline_memory.py            # the CPU smoke: tiny config, no GPU figures (printed as n/a)
"""

from __future__ import annotations

import argparse
import time
from typing import Optional

GIB = 1024 ** 3


def knobs_of(text: str) -> dict:
    batch, prefetch, sync = (int(v) for v in text.split(","))
    return {"batch_size": batch, "prefetch": prefetch, "sync_every": sync}


class NvmlMemory:
    """The agent's reading of one GPU's memory: (used + reserved) / total, % (signals.mem_used_pct's formula)."""

    def __init__(self, index: Optional[int]):
        self.handle = self.nv = None
        if index is None:
            return
        try:
            import pynvml as nv
            nv.nvmlInit()
            self.nv, self.handle = nv, nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # no driver: the line says n/a and why, once
            print(f"NVML not read: {e}", flush=True)

    def pct(self) -> Optional[float]:
        if self.handle is None:
            return None
        m = self.nv.nvmlDeviceGetMemoryInfo(self.handle, version=self.nv.nvmlMemory_v2)
        return 100.0 * (m.used + m.reserved) / m.total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--device-map", default="cpu")
    ap.add_argument("--knobs", default="64,2,4", help="batch_size,prefetch,sync_every")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4, help="a line every this many steps")
    args = ap.parse_args()

    import torch

    from trimtab.workload.config import parse_device_map, preset
    from trimtab.workload.loop import Pipeline, set_cpu_threads

    config, devices = preset(args.config), parse_device_map(args.device_map)
    set_cpu_threads(devices)
    cuda = torch.cuda.is_available() and "cuda" in args.device_map
    index = int(args.device_map.split("cuda:")[1].split(",")[0].split(";")[0]) if cuda else None
    nvml = NvmlMemory(index)
    dev = torch.device(f"cuda:{index}") if cuda else None
    total = torch.cuda.get_device_properties(dev).total_memory if cuda else None

    def gib(v: Optional[int]) -> str:
        return "n/a" if v is None else f"{v / GIB:6.2f}"

    print(f"config {config.name}; {devices}; knobs {args.knobs}; GPU total {gib(total)} GiB", flush=True)
    print(f"{'step':>5} {'samples/s':>9} {'peak GiB':>8} {'alloc GiB':>9} {'reserved GiB':>12} "
          f"{'NVML used+res %':>15} {'peak % of total':>15}", flush=True)
    first: Optional[float] = None
    with Pipeline(config, devices, knobs=knobs_of(args.knobs)) as pipe:
        done, t0 = 0, time.perf_counter()
        while done < args.steps:
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            n = min(args.every, args.steps - done)
            records = pipe.run(n)
            done += n
            rate = sum(r.samples for r in records) / max(1e-9, sum(r.step_s for r in records))
            peak = torch.cuda.max_memory_allocated(dev) if cuda else None
            alloc = torch.cuda.memory_allocated(dev) if cuda else None
            reserved = torch.cuda.memory_reserved(dev) if cuda else None
            used = nvml.pct()
            first = used if first is None else first
            print(f"{done:>5} {rate:>9.2f} {gib(peak):>8} {gib(alloc):>9} {gib(reserved):>12} "
                  f"{'n/a' if used is None else f'{used:.1f}':>15} "
                  f"{'n/a' if peak is None else f'{100.0 * peak / total:.1f}':>15}", flush=True)
    print(f"{done} steps in {time.perf_counter() - t0:.0f} s; NVML used+reserved "
          f"{'n/a' if first is None else f'{first:.1f} → {used:.1f} %'} (the memory rule acts above 98 %)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
