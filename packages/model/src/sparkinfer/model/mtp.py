"""Qwen's multi-token prediction head (`mtp.*`, model.md §10) as an inference module over its own
paged KV cache.

Row r pairs the token t_{p+1} that follows target position p with a hidden state h: the target's
final-normed hidden state H_p (the first draft step), or the head's own output of the row before
(further steps). x = fc([pre_fc_norm_embedding(embed(t_{p+1})) | pre_fc_norm_hidden(h)]) runs
through one full-attention decoder layer at the rotary position of t_{p+1} (p + 1), whose KV
goes to cache index p of the head's own attention cache (`cache_idx`, one more entry in the
model's `CacheSpec`, paged with the target's block tables); `norm` gives the output, and the
target's `lm_head` its draft logits. The embedding and the head are the target's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from sparkinfer.model.cache_spec import AttentionCacheSpec
from sparkinfer.model.config import TextConfig
from sparkinfer.model.errors import CheckpointError
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.attention import GatedAttention
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.layers.mlp import MLP
from sparkinfer.model.layers.norm import RMSNorm
from sparkinfer.model.layers.rotary import RotaryEmbedding
from torch import nn

MTP_PREFIX = "mtp."
_MTP_LAYER = "layers.0."
# The head's layer fuses what the checkpoint keeps apart, as the decoder layers do (weights.py).
_FUSED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}  # fmt: skip


class MTPLayer(nn.Module):
    """`mtp.layers.0`: a full-attention decoder layer (gated attention, SwiGLU MLP)."""

    def __init__(
        self,
        config: TextConfig,
        cache_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        self.self_attn = GatedAttention(config, cache_idx, **dims)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, **dims)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **dims)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **dims)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, stream, h_fp8 = self.input_layernorm.forward_for(self.self_attn.qkv_proj, x)
        h = self.self_attn(h, *rope, batch, x_fp8=h_fp8)
        h, stream, h_fp8 = self.post_attention_layernorm.forward_for(
            self.mlp.gate_up_proj, h, stream
        )
        return self.mlp(h, h_fp8), stream


class MTPHead(nn.Module):
    """The MTP head of a Qwen3.8 checkpoint; parameters keep the checkpoint's names below `mtp.`.

    Args:
        config: the target's text config (the head has the shapes of its attention layers).
        ops, device, dtype: as the target's.
    """

    def __init__(
        self, config: TextConfig, *, ops: KernelOps, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.cache_idx = config.num_hidden_layers  # its KV cache's key, past the target's layers
        self.fc = Linear(2 * hidden, hidden, **dims)
        self.pre_fc_norm_embedding = RMSNorm(hidden, eps, **dims)
        self.pre_fc_norm_hidden = RMSNorm(hidden, eps, **dims)
        self.layers = nn.ModuleList([MTPLayer(config, self.cache_idx, **dims)])
        self.norm = RMSNorm(hidden, eps, **dims)
        self.rotary_emb = RotaryEmbedding(
            config.rotary_dim, config.rope_theta, config.mrope_section, device=device
        )

    def cache_spec(self, dtype: torch.dtype) -> AttentionCacheSpec:
        """The head's paged KV: one full-attention layer's, keyed `cache_idx`."""
        c = self.config
        return AttentionCacheSpec(self.cache_idx, c.num_key_value_heads, c.head_dim, dtype)

    @torch.inference_mode()
    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """embeds [T, hidden] (the target's embedding of each row's next token), hidden
        [T, hidden] (H_p, or the head's previous output) -> the head's output [T, hidden]; writes
        each row's KV at the cache index `batch` gives it (positions: those of the next tokens).
        """
        e, _ = self.pre_fc_norm_embedding(embeds)
        h, _ = self.pre_fc_norm_hidden(hidden)
        x = self.fc(torch.cat([e, h], dim=-1))
        rope = self.rotary_emb(batch.positions)
        x, residual = self.layers[0](x, rope, batch)
        out, _ = self.norm(x, residual)
        return out

    @torch.no_grad()
    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the checkpoint's `mtp.*` tensors (checkpoint names) into the parameters."""
        params = dict(self.named_parameters())
        expected: set[str] = set()
        for name, param in params.items():
            layer_name = name.removeprefix(_MTP_LAYER)
            parts = _FUSED.get(layer_name) if name.startswith(_MTP_LAYER) else None
            names = [MTP_PREFIX + _MTP_LAYER + p for p in parts] if parts else [MTP_PREFIX + name]
            expected.update(names)
            missing = [n for n in names if n not in tensors]
            if missing:
                raise CheckpointError(
                    f"the checkpoint has no {missing[0]}: its mtp.* tensors do not make Qwen's "
                    "MTP head; serve it with speculative off or ngram"
                )
            value = torch.cat([tensors[n] for n in names]) if parts else tensors[names[0]]
            if value.shape != param.shape:
                raise CheckpointError(
                    f"{' + '.join(names)} has shape {list(value.shape)}; the MTP head expects "
                    f"{list(param.shape)}: the checkpoint does not match its config.json"
                )
            param.copy_(value)
        unexpected = sorted(set(tensors) - expected)
        if unexpected:
            raise CheckpointError(
                f"unexpected MTP tensors {unexpected[:8]}: only mtp_num_hidden_layers = 1 is "
                "supported"
            )
