"""A trainable DFlash drafter: the computation of `sparkinfer.model.drafters.dflash.BlockDrafter`
(docs/model.md §17) over many blocks at once, with the checkpoint's parameter names.

Context features of position p: c_p = hidden_norm(fc(taps(p))); each layer projects them to its
own K/V (k_norm, rope at p). A block at anchor a holds the anchor's token and mask tokens at
positions a .. a + S - 1; its rows see the context before a and every row of their own block
(non-causal), never another block. The final norm, then the target's (frozen) tied LM head. Rope,
rotation and the plain-weight RMSNorm are the server's own modules, so training computes what
the server runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.model.drafters.layers import DraftRMSNorm, apply_rope
from sparkinfer.model.layers.rotary import RotaryEmbedding
from torch import nn


@dataclass(frozen=True)
class DrafterShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int

    def config_json(self) -> dict[str, Any]:
        """config.json in the published DFlash layout (what `drafters.config` reads)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "layer_types": ["full_attention"] * self.num_layers,
            "max_position_embeddings": 262144,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "dtype": "bfloat16",
        }

    def dumps(self) -> str:
        return json.dumps(self.config_json(), indent=2) + "\n"


def dflash_tap_layers(
    num_target_layers: int, num_draft_layers: int, end_before: int = 3
) -> tuple[int, ...]:
    """As many taps as drafter layers, spread evenly from layer 1 to layer num_target_layers -
    end_before; the published rule's 3 gives 1, 16, 31, 46, 61 for 64 target and 5 drafter
    layers. A shallow target keeps its last layers closer (8 layers, end_before 2: 1, 4, 6)."""
    start, end = 1, num_target_layers - end_before
    if num_draft_layers == 1:
        return ((start + end) // 2,)
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def _norm(dim: int, eps: float) -> DraftRMSNorm:
    norm = DraftRMSNorm(dim, eps, device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        norm.weight.fill_(1.0)
    return norm


class Attention(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        h, d = s.hidden_size, s.head_dim
        self.heads, self.kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, d
        self.q_proj = nn.Linear(h, s.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(s.num_heads * d, h, bias=False)
        self.q_norm = _norm(d, s.rms_norm_eps)
        self.k_norm = _norm(d, s.rms_norm_eps)

    def key_value(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, hidden], rope of [B * T] positions -> k, v [B, KV, T, D]."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b * t, self.kv_heads, self.head_dim))
        k = apply_rope(k, *rope).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context_kv: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Block rows x [B, R, hidden]; context K/V [B, KV, L, D]; mask [B, 1, R, L + R]."""
        b, r, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b * r, self.heads, self.head_dim))
        q = apply_rope(q, *rope).view(b, r, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.key_value(x, rope)
        k = torch.cat([context_kv[0], k], dim=2)
        v = torch.cat([context_kv[1], v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
            enable_gqa=self.heads != self.kv_heads,
        )  # fmt: skip
        return self.o_proj(out.transpose(1, 2).reshape(b, r, -1))


class MLP(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = _norm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = _norm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, rope, context, context_rope, mask) -> torch.Tensor:
        kv = self.self_attn.key_value(context, context_rope)
        x = x + self.self_attn(self.input_layernorm(x), rope, kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TrainableDrafter(nn.Module):
    """The drafter's own parameters (names as the checkpoint's); the target's embedding and tied
    LM head are passed in, frozen."""

    embed_weight: torch.Tensor
    head_weight: torch.Tensor

    def __init__(self, s: DrafterShape, embed_weight: torch.Tensor, head_weight: torch.Tensor):
        super().__init__()
        self.shape = s
        n_taps = len(s.target_layer_ids)
        self.fc = nn.Linear(n_taps * s.hidden_size, s.hidden_size, bias=False)
        self.hidden_norm = _norm(s.hidden_size, s.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.num_layers))
        self.norm = _norm(s.hidden_size, s.rms_norm_eps)
        cpu = torch.device("cpu")
        self.rotary = RotaryEmbedding(s.head_dim, s.rope_theta, (0, 0, 0), device=cpu)
        self.register_buffer("embed_weight", embed_weight, persistent=False)
        self.register_buffer("head_weight", head_weight, persistent=False)
        for name, p in self.named_parameters():
            if not name.endswith("norm.weight"):
                nn.init.normal_(p, std=0.02)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The parameters under their checkpoint names, bf16, contiguous on the CPU."""
        return {
            name: p.detach().to(torch.bfloat16).cpu().contiguous()
            for name, p in self.named_parameters()
        }

    def forward(
        self,
        taps: torch.Tensor,
        anchors: torch.Tensor,
        anchor_ids: torch.Tensor,
        block_size: int,
    ) -> torch.Tensor:
        """taps [B, L, n_taps * hidden] (positions 0 .. L - 1), anchors [B, N] positions and
        anchor_ids [B, N] their tokens -> the final-normed hidden states of the mask rows
        [B, N, block_size - 1, hidden]."""
        b, length, _ = taps.shape
        n, s = anchors.shape[1], block_size
        device = taps.device
        context = self.hidden_norm(self.fc(taps))
        context_positions = torch.arange(length, device=device).repeat(b)
        context_rope = self.rotary(context_positions)
        ids = torch.full((b, n, s), self.shape.mask_token_id, dtype=torch.int64, device=device)
        ids[:, :, 0] = anchor_ids
        x = F.embedding(ids.view(b, n * s), self.embed_weight).to(context.dtype)
        positions = anchors[:, :, None] + torch.arange(s, device=device)  # [B, N, S]
        rope = self.rotary(positions.reshape(-1))
        sees_context = torch.arange(length, device=device) < anchors[:, :, None, None]
        block_of = torch.arange(n * s, device=device) // s
        sees_block = (block_of[:, None] == block_of[None, :]).view(1, n, s, n * s)
        mask = torch.cat(
            [sees_context.expand(b, n, s, length), sees_block.expand(b, n, s, n * s)], dim=-1
        ).view(b, 1, n * s, length + n * s)
        for layer in self.layers:
            x = layer(x, rope, context, context_rope, mask)
        return self.norm(x.view(b, n, s, -1)[:, :, 1:])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight.to(hidden.dtype)).float()
