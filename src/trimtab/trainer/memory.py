"""Allocator statistics of the rank's GPU (fragmentation, retries, OOMs), the GPU's free memory as the job sees it,
and recognising an out-of-memory error.

``torch.cuda.memory_stats()`` costs ~150 µs on the H200, so it is read at most every
``every_s`` seconds and the result rides on the next report. NVML cannot see fragmentation: only the process's
own caching allocator knows how much of what it reserved is actually allocated. The free memory
(``torch.cuda.mem_get_info``, one cudaMemGetInfo) is read with it: what is neither free nor this process's reserved
memory is another process's (a neighbour on the GPU), and the rebalancer plans raises below what is left.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from trimtab.trainer.timing import cuda_in_use


def is_oom(exc: BaseException) -> bool:
    """``torch.cuda.OutOfMemoryError``, or a RuntimeError that says "out of memory" (older torch, NCCL, custom
    kernels and other allocators raise a plain RuntimeError with that text)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class MemorySampler:
    """Rate-limited ``memory_stats()``: a dict for the next report, or None (not due, or no CUDA in use)."""

    def __init__(self, every_s: float = 5.0, stats_fn: Optional[Callable[[], dict]] = None,
                 enabled_fn: Callable[[], bool] = cuda_in_use, reset_peak_fn: Optional[Callable[[], None]] = None,
                 total_fn: Optional[Callable[[], Optional[int]]] = None,
                 free_fn: Optional[Callable[[], Optional[int]]] = None):
        self.every_s = every_s
        self._stats_fn = stats_fn or torch.cuda.memory_stats
        # The peak is reset after each sample, so the next one is the peak of the steps since (at the batch size
        # they ran at) — what the rebalancer's memory prediction learns from.
        self._reset_peak_fn = reset_peak_fn if reset_peak_fn is not None else (
            torch.cuda.reset_peak_memory_stats if stats_fn is None else (lambda: None))
        self._total_fn = total_fn if total_fn is not None else (_device_total if stats_fn is None else (lambda: None))
        self._free_fn = free_fn if free_fn is not None else (_device_free if stats_fn is None else (lambda: None))
        self._enabled_fn = enabled_fn
        self._next_s = float("-inf")
        self._last_retries: Optional[int] = None
        self._last_ooms: Optional[int] = None

    def since_now(self) -> None:
        """Starts the peak from now (the hook calls it at attach): the first sample's peak is then the peak since
        attach, not the high point of an earlier phase of the process (loading, a previous run) that says nothing
        about this loop's batch size. Without CUDA in use there is no earlier peak to drop."""
        if self._enabled_fn():
            self._reset_peak()

    def _reset_peak(self) -> None:
        try:
            self._reset_peak_fn()
        except Exception:  # a peak that cannot be reset only makes the next one an older high point
            pass

    def maybe_sample(self, now_s: float) -> Optional[dict]:
        if self.every_s <= 0 or now_s < self._next_s or not self._enabled_fn():
            return None
        self._next_s = now_s + self.every_s
        return self.sample()

    def sample(self) -> dict:
        stats = self._stats_fn()
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        reserved = int(stats.get("reserved_bytes.all.current", 0))
        inactive = int(stats.get("inactive_split_bytes.all.current", 0))
        retries = int(stats.get("num_alloc_retries", 0))
        ooms = int(stats.get("num_ooms", 0))
        peak = stats.get("allocated_bytes.all.peak")
        self._reset_peak()
        out = {
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "peak_allocated_bytes": int(peak) if peak is not None else None,
            "total_bytes": self._total_fn(),
            "free_bytes": self._free_fn(),
            # Fragmentation = free memory stranded inside split blocks (usable only by allocations that fit the
            # holes) over reserved memory. Not 1 − allocated/reserved: at a step boundary the activations are
            # freed but stay cached, which reads 50–90 % "fragmented" on a perfectly healthy job.
            # Nothing reserved: nothing to fragment; None rather than a made-up 0.
            "fragmentation": min(1.0, max(0.0, inactive / reserved)) if reserved > 0 else None,
            "cached_free_fraction": min(1.0, max(0.0, 1.0 - allocated / reserved)) if reserved > 0 else None,
            # The API stores the cumulative counters (as torch keeps them); deltas are for local readers.
            "num_alloc_retries": retries,
            "num_ooms": ooms,
            "alloc_retries_delta": retries - self._last_retries if self._last_retries is not None else None,
            "ooms_delta": ooms - self._last_ooms if self._last_ooms is not None else None,
        }
        self._last_retries, self._last_ooms = retries, ooms
        return out


def _device_free() -> Optional[int]:
    """Free bytes of the current device as the driver counts them (every process's memory taken out)."""
    try:
        return int(torch.cuda.mem_get_info()[0])
    except Exception:
        return None


def _device_total() -> Optional[int]:
    try:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    except Exception:
        return None
