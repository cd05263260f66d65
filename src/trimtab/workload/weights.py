"""The weight sync ("communication"): trained actor → generation copy, the cost that ``sync_every`` amortises.

``direct`` copies parameter by parameter (same device, a peer GPU, or CPU). ``host`` flattens the weights to the
generation copy's dtype, moves them through one pinned host buffer and back out, as when the inference engine is
another process or node: on a single GPU a device-to-device copy would cost well under a millisecond and hide the
trade-off that sync frequency controls in real async RL. Both move every byte for real; the cost grows with the
model.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightSync:
    def __init__(self, source: nn.Module, target: nn.Module, via: str = "direct"):
        if via not in ("direct", "host"):
            raise ValueError(f"sync_via must be 'direct' or 'host', not {via!r}")
        self.via = via
        self._pairs = list(zip(source.parameters(), target.parameters(), strict=True))
        for src, dst in self._pairs:
            if src.shape != dst.shape:
                raise ValueError(f"shape mismatch {tuple(src.shape)} vs {tuple(dst.shape)}")
        self._source_device = self._pairs[0][0].device
        self._target_device = self._pairs[0][1].device
        self._dtype = self._pairs[0][1].dtype
        self.bytes_per_sync = sum(dst.numel() * dst.element_size() for _, dst in self._pairs)
        self._host = None
        if via == "host":
            numel = sum(dst.numel() for _, dst in self._pairs)
            self._host = torch.empty(numel, dtype=self._dtype, pin_memory=torch.cuda.is_available())

    @torch.no_grad()
    def copy(self) -> None:
        """Copy now and return once the generation copy holds the new weights (the caller pauses generation)."""
        if self.via == "direct":
            for src, dst in self._pairs:
                dst.copy_(src)
        else:
            flat = torch.cat([src.detach().reshape(-1).to(self._dtype) for src, _ in self._pairs])
            self._host.copy_(flat, non_blocking=True)
            self._finish(self._source_device)
            staged = self._host.to(self._target_device, non_blocking=True)
            for (_, dst), chunk in zip(self._pairs, staged.split([dst.numel() for _, dst in self._pairs])):
                dst.copy_(chunk.view_as(dst))
        self._finish(self._source_device)
        self._finish(self._target_device)

    @staticmethod
    def _finish(device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
