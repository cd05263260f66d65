"""CUDA streams for the workers: each worker thread issues its GPU work on its own stream per device, so generation,
scoring and the update can overlap on one GPU; on CPU every helper here is a no-op."""

from __future__ import annotations

import contextlib

import torch


class WorkerStreams:
    """One stream per CUDA device a worker touches, created lazily in that worker."""

    def __init__(self):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    @contextlib.contextmanager
    def on(self, device: torch.device):
        """Run the block with this worker's stream current on ``device`` (and ``device`` current)."""
        if device.type != "cuda":
            yield
            return
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        with torch.cuda.device(device), torch.cuda.stream(stream):
            yield

    def finish(self) -> None:
        """Block this thread until the work it issued is done, so its results are safe on any stream and its
        wall-clock timings include the device time."""
        for stream in self._streams.values():
            stream.synchronize()


def hand_over(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a tensor made on another worker's stream as used by the current one, so the caching allocator does not
    recycle its memory while this stream may still read it (the producer already finished writing it)."""
    if tensor.is_cuda:
        tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return tensor


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (the trained fp32 actor and critic); plain fp32 on CPU, where bf16 is slow."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def inference_dtype(device: torch.device) -> torch.dtype:
    """Dtype of frozen copies (generation copy, reference, reward model): bf16 on GPU as inference engines hold
    them; fp32 on CPU, which also keeps the synced copy bit-equal to the actor there."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
