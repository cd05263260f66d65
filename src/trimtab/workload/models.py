"""The networks of the pipeline, written out so their cost is real and visible: a pre-LN causal transformer trunk
with a preallocated KV cache, used as the actor (tied LM head), the critic (value per position) and the reward
model (per-token "matches the rule" logit)."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelSize


class KVCache:
    """Keys and values of every layer for one generation call, allocated once at the full sequence length so that
    decoding a token writes in place instead of growing tensors."""

    def __init__(self, n_layers: int, batch: int, n_heads: int, max_tokens: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (n_layers, batch, n_heads, max_tokens, head_dim)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]


class Block(nn.Module):
    """Pre-LN attention then MLP, each added to the residual stream."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor, layer_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                pos: int = 0) -> torch.Tensor:
        batch, tokens, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(self.ln1(x)).view(batch, tokens, 3, self.n_heads, head_dim).permute(2, 0, 3, 1, 4)
        if layer_cache is not None:
            # Only a prefill starts at 0 with many tokens; later calls add one token that may see every cached one.
            assert tokens == 1 or pos == 0, "multi-token calls with a cache must start at position 0"
            cache_k, cache_v = layer_cache
            cache_k[:, :, pos:pos + tokens] = k
            cache_v[:, :, pos:pos + tokens] = v
            k, v = cache_k[:, :, :pos + tokens], cache_v[:, :, :pos + tokens]
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=tokens > 1)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, tokens, d_model))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Trunk(nn.Module):
    """Token and learned position embeddings, the blocks, a final LayerNorm: the body all three networks share."""

    def __init__(self, vocab_size: int, size: ModelSize, max_tokens: int):
        super().__init__()
        if size.d_model % size.n_heads:
            raise ValueError(f"d_model {size.d_model} is not a multiple of n_heads {size.n_heads}")
        self.size = size
        self.tok = nn.Embedding(vocab_size, size.d_model)
        self.pos = nn.Embedding(max_tokens, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.n_heads) for _ in range(size.n_layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        self.apply(self._init)
        for block in self.blocks:   # GPT-2's scaling keeps the residual stream's variance flat with depth
            nn.init.normal_(block.fc2.weight, std=0.02 / math.sqrt(2 * size.n_layers))
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * size.n_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        x = self.tok(tokens) + self.pos.weight[pos:pos + tokens.shape[1]]
        for index, block in enumerate(self.blocks):
            x = block(x, cache.layer(index) if cache is not None else None, pos)
        return self.ln_f(x)


class CausalLM(nn.Module):
    """The actor, and its frozen reference and generation copies: a trunk whose output head is the token
    embedding (tied), so the head adds compute but no parameters."""

    def __init__(self, vocab_size: int, size: ModelSize, max_tokens: int):
        super().__init__()
        self.trunk = Trunk(vocab_size, size, max_tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.trunk.tok.weight)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        return self.logits(self.trunk(tokens, cache, pos))

    def new_cache(self, batch: int, max_tokens: int) -> KVCache:
        weight = self.trunk.tok.weight
        size = self.trunk.size
        return KVCache(size.n_layers, batch, size.n_heads, max_tokens, size.d_model // size.n_heads,
                       weight.device, weight.dtype)


class TokenScorer(nn.Module):
    """A trunk with one scalar per position: the critic's value estimate, or the reward model's logit that the
    token at that position follows the task's rule."""

    def __init__(self, vocab_size: int, size: ModelSize, max_tokens: int):
        super().__init__()
        self.trunk = Trunk(vocab_size, size, max_tokens)
        self.head = nn.Linear(size.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(tokens)).squeeze(-1)


def frozen_copy(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """An independent copy that takes no gradients (the reference, the generation copy, the frozen reward model)."""
    clone = copy.deepcopy(model).to(device=device, dtype=dtype)
    clone.requires_grad_(False)
    return clone.eval()
