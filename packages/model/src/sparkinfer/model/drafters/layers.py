"""A block drafter's decoder layers: Qwen3-style attention over cached context + its own block,
SwiGLU MLP, plain-weight RMSNorm, full-head rope; DFlash2's in-block convolutions around both.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from sparkinfer.model.drafters.block_conv import InBlockConv
from sparkinfer.model.drafters.cache import DrafterCache
from sparkinfer.model.drafters.config import DFLASH2, DrafterConfig
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from torch import nn


class BlockRows(NamedTuple):
    """Where one proposal's block reads and writes in the drafter cache: either the gathered
    keys and a mask per layer (pages under 16 positions), or the pages and lengths of a paged
    attention (each row's key range from its sequence's length, its layer's window and
    causality)."""

    block: torch.Tensor  # [B * S] cache rows of the block's positions (its K/V scratch)
    keys: torch.Tensor | None  # [B, L] cache rows of positions 0 .. L - 1 of each sequence
    masks: tuple[torch.Tensor, ...]  # per layer, [B, 1, S, L] bool: the keys each row sees
    context_lens: torch.Tensor | None = None  # paged: [B] int32, anchor + S keys per row
    page_tables: torch.Tensor | None = None  # paged: [B, M] int32, each sequence's pages


class DraftRMSNorm(nn.Module):
    """Qwen3's RMSNorm, y = w * norm(x) with the plain weight (the target's norms use 1 + w)."""

    def __init__(self, dim: int, eps: float, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = new_parameter(dim, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated (rotate_half, whole head) by cos/sin [T, D] fp32."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class DraftAttention(nn.Module):
    """Queries from the block rows; keys and values from the cached context and the block."""

    def __init__(
        self,
        config: DrafterConfig,
        layer_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        hidden, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, d
        )  # fmt: skip
        self.layer_idx = layer_idx
        self.window = config.sliding_windows[layer_idx]
        self.is_causal = config.is_causal
        self.ops = ops
        self.q_proj = Linear(hidden, self.num_heads * d, **dims)
        self.k_proj = Linear(hidden, self.num_kv_heads * d, **dims)
        self.v_proj = Linear(hidden, self.num_kv_heads * d, **dims)
        self.o_proj = Linear(self.num_heads * d, hidden, **dims)
        self.q_norm = DraftRMSNorm(d, config.rms_norm_eps, device=device, dtype=dtype)
        self.k_norm = DraftRMSNorm(d, config.rms_norm_eps, device=device, dtype=dtype)

    def key_value(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (k, v) [T, KV, D], k normed and rotated."""
        t = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim))
        return apply_rope(k, cos, sin), self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: DrafterCache,
        rows: BlockRows,
    ) -> torch.Tensor:
        """x [B, S, hidden] block rows -> [B, S, hidden]; writes the rows' K/V at their cache
        rows, then attends over the paged context (`rows.page_tables`) or over the cache rows
        `rows.keys` where `rows.masks` allows."""
        b, s, hidden = x.shape
        flat = x.reshape(b * s, hidden)
        q = self.q_norm(self.q_proj(flat).view(b * s, self.num_heads, self.head_dim))
        q = apply_rope(q, *rope)
        k, v = self.key_value(flat, *rope)
        cache.k[self.layer_idx].index_copy_(0, rows.block, k)
        cache.v[self.layer_idx].index_copy_(0, rows.block, v)
        if rows.keys is None:
            out = self._paged(q.view(b, s, self.num_heads, self.head_dim), cache, rows)
            return self.o_proj(out).view(b, s, hidden)
        keys = cache.k[self.layer_idx][rows.keys].transpose(1, 2)  # [B, KV, L, D]
        values = cache.v[self.layer_idx][rows.keys].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.view(b, s, self.num_heads, self.head_dim).transpose(1, 2),
            keys,
            values,
            attn_mask=rows.masks[self.layer_idx],
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, S, D]
        return self.o_proj(out.transpose(1, 2).reshape(b * s, -1)).view(b, s, hidden)

    def _paged(self, q: torch.Tensor, cache: DrafterCache, rows: BlockRows) -> torch.Tensor:
        """q [B, S, H, D] -> [B * S, H * D]: each block row over its sequence's pages, up to
        context_lens[b] positions. A row that sees every one of them (no window, not causal)
        is one decode query per sequence whose heads are the block's rows of each KV head's
        query heads (the split-KV decode kernel: KV head h's S x H / KV queries read its keys
        once); else the block kernel gives each row its own key range."""
        assert rows.context_lens is not None and rows.page_tables is not None
        b, s, h, d = q.shape
        kv, group = self.num_kv_heads, h // self.num_kv_heads
        pages = (-1, cache.block_size, kv, d)
        k_cache = cache.k[self.layer_idx].view(pages)
        v_cache = cache.v[self.layer_idx].view(pages)
        if self.window is not None or self.is_causal:
            out = self.ops.paged_attention_block(
                q, k_cache, v_cache, context_lens=rows.context_lens,
                block_tables=rows.page_tables, scale=d**-0.5, window=self.window,
                is_causal=self.is_causal,
            )  # fmt: skip
            return out.view(b * s, h * d)
        packed = q.view(b, s, kv, group, d).permute(0, 2, 1, 3, 4).reshape(b, kv * s * group, d)
        out = self.ops.paged_attention_decode(  # [B, KV * S * group, D]
            packed, k_cache, v_cache, context_lens=rows.context_lens,
            block_tables=rows.page_tables, scale=d**-0.5,
        )  # fmt: skip
        return out.view(b, kv, s, group, d).permute(0, 2, 1, 3, 4).reshape(b * s, h * d)


class DraftMLP(nn.Module):
    """SwiGLU with the checkpoint's separate gate_proj, up_proj and down_proj."""

    def __init__(
        self, hidden: int, intermediate: int, *, ops: KernelOps, device: torch.device,
        dtype: torch.dtype,
    ) -> None:  # fmt: skip
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        self.gate_proj = Linear(hidden, intermediate, **dims)
        self.up_proj = Linear(hidden, intermediate, **dims)
        self.down_proj = Linear(intermediate, hidden, **dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, hidden] -> [B, S, hidden]."""
        flat = x.reshape(-1, x.shape[-1])
        y = self.down_proj(F.silu(self.gate_proj(flat)) * self.up_proj(flat))
        return y.view(x.shape)


class DraftLayer(nn.Module):
    """x = x + attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)); DFlash2
    convolves each sublayer's input and output along the block (`attention_conv`, `mlp_conv`)."""

    def __init__(
        self,
        config: DrafterConfig,
        layer_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = DraftAttention(config, layer_idx, ops=ops, device=device, dtype=dtype)
        self.mlp = DraftMLP(hidden, config.intermediate_size, ops=ops, device=device, dtype=dtype)
        self.input_layernorm = DraftRMSNorm(hidden, eps, device=device, dtype=dtype)
        self.post_attention_layernorm = DraftRMSNorm(hidden, eps, device=device, dtype=dtype)
        self.attention_conv: InBlockConv | None = None
        self.mlp_conv: InBlockConv | None = None
        if config.layout == DFLASH2:
            conv = (hidden, config.conv_kernel_size, config.conv_group_size)
            self.attention_conv = InBlockConv(*conv, ops=ops, device=device, dtype=dtype)
            self.mlp_conv = InBlockConv(*conv, ops=ops, device=device, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: DrafterCache,
        rows: BlockRows,
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.attention_conv is not None:
            h, dynamic = self.attention_conv.prepare(h)
            h = self.self_attn(h, rope, cache, rows)
            h = self.attention_conv.finish(h, dynamic)
        else:
            h = self.self_attn(h, rope, cache, rows)
        x = x + h
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, dynamic = self.mlp_conv.prepare(h)
            h = self.mlp_conv.finish(self.mlp(h), dynamic)
        else:
            h = self.mlp(h)
        return x + h
