"""Gated full attention with GQA over the paged KV cache (docs/model.md §4).

qkv_proj is one GEMM giving [q_and_gate | k | v] (the checkpoint's q_proj, k_proj and v_proj,
stacked by rows in weights.py); the three parts are views of its output, no copies. q_and_gate
holds [q_h | gate_h] per head (not two global halves). q and k get a (1+w) RMSNorm over each head
before the partial rotary, fused with the KV-cache write into one kernel (`qk_norm_rotary`); the
q_norm/k_norm modules only hold the checkpoint's norm weights. The output is multiplied by
sigmoid(gate) before o_proj.
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.fp8_linear import Fp8Activation
from sparkinfer.model.config import TextConfig
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.layers.norm import RMSNorm
from torch import nn


class GatedAttention(nn.Module):
    """One full-attention mixer (`self_attn.*` in the checkpoint)."""

    def __init__(
        self,
        config: TextConfig,
        layer_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.ops = ops
        dims = {"ops": ops, "device": device, "dtype": dtype}
        hidden, q_width = config.hidden_size, self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        self.qkv_sizes = (2 * q_width, kv_width, kv_width)
        self.qkv_proj = Linear(hidden, sum(self.qkv_sizes), **dims)
        self.o_proj = Linear(q_width, hidden, **dims)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, **dims)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, **dims)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        output_rows: torch.Tensor | None = None,
        x_fp8: Fp8Activation | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] (normed), cos/sin [T, rotary_dim] -> [T, hidden], or [N, hidden] at
        output_rows (o_proj runs on those rows only); x_fp8: x quantized for an FP8 qkv_proj."""
        num_tokens = x.shape[0]
        q_gate, k, v = self.qkv_proj(x, x_fp8).split(self.qkv_sizes, dim=-1)
        q_gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim)
        q, gate = q_gate.split(self.head_dim, dim=-1)  # each [T, H, D]; per-head halves
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        cache = batch.caches.attention[self.layer_idx]
        # One op norms and rotates q and k and stores k and v in the cache (a single kernel on
        # CUDA), reading the strided views; q comes back contiguous [T, H, D].
        q = self.ops.qk_norm_rotary(
            q,
            k,
            v,
            q_weight=self.q_norm.weight,
            k_weight=self.k_norm.weight,
            eps=self.q_norm.eps,
            cos=cos,
            sin=sin,
            k_cache=cache.k,
            v_cache=cache.v,
            slot_mapping=batch.slot_mapping,
        )
        if batch.is_decode:
            o = self.ops.paged_attention_decode(
                q,
                cache.k,
                cache.v,
                context_lens=batch.context_lens,
                block_tables=batch.block_tables,
                scale=self.scale,
                gate=gate,
            )
        else:
            o = self.ops.paged_attention_prefill(
                q,
                cache.k,
                cache.v,
                cu_seqlens=batch.cu_seqlens,
                cached_lens=batch.cached_lens,
                block_tables=batch.block_tables,
                scale=self.scale,
                gate=gate,
                index_cache=batch.index_cache,
            )
        o = o.reshape(num_tokens, -1)
        return self.o_proj(o if output_rows is None else o[output_rows])
