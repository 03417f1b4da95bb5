"""The multi-token-prediction head in Qwen's checkpoint layout, for training with transformers.

`mtp.fc` maps [pre_fc_norm_embedding(embed(t+1)) | pre_fc_norm_hidden(h)] to the hidden size,
one full-attention decoder layer follows, then `mtp.norm`; the trunk's tied embedding and head are
shared. `h` is the trunk's last hidden state after its final norm (first step) or the head's own
normed output (further steps), as a speculative decoder feeds it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

INIT_STD = 0.02


class MTPHead(nn.Module):
    def __init__(self, text_config) -> None:
        super().__init__()
        cfg = copy.deepcopy(text_config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, INIT_STD)
            elif isinstance(module, Qwen3_5RMSNorm):
                module.weight.zero_()  # (1+w) norms: w = 0 is the identity scale

    def forward(
        self,
        embeds: torch.Tensor,  # [B, L, H]: embeddings of the known next tokens
        hidden: torch.Tensor,  # [B, L, H]: trunk (or previous step) hidden states
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        position_ids: torch.Tensor,  # [B, L]: the positions of those next tokens
    ) -> torch.Tensor:
        x = self.fc(
            torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        )
        out = self.layers[0](
            x, position_embeddings=position_embeddings, attention_mask=None,
            position_ids=position_ids,
        )  # fmt: skip
        return self.norm(out[0] if isinstance(out, tuple) else out)
