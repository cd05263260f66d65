"""Tiny models and data the framework adapters' tests train for real on CPU (nothing from the hub)."""

from __future__ import annotations

import torch


class TinyRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def examples(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)} for _ in range(n)]
