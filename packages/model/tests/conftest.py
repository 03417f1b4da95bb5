"""Fixtures: small random Qwen3.5 checkpoints written by transformers, and a paged step runner."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch

VOCAB = 320
ROPE = {
    "rope_type": "default",
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [2, 1, 1],
    "mrope_interleaved": True,
}
# 4 layers (L L L F); GQA group 3; 3 value heads per key head; 8 of 32 head dims rotate.
TEXT_SMALL: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "rope_parameters": ROPE,
    "eos_token_id": 2,
}
# 8 layers (two L L L F groups); GQA group 4; 16 of 64 head dims rotate.
TEXT_WIDE: dict[str, Any] = {
    **TEXT_SMALL,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 3,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "rope_parameters": {**ROPE, "mrope_section": [3, 3, 2]},
}
VISION_TINY: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
}


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Give norms, gates and decays non-default values so every parameter matters."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):  # decay rates 0.05..1.5 keep a long memory in the state
            p.copy_(torch.empty(p.shape).uniform_(0.05, 1.5, generator=gen).log())
        elif name.endswith("dt_bias"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        elif name.endswith("linear_attn.norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith("norm.weight") or name.endswith("norm1.weight"):
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        elif p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.08)


def write_checkpoint(
    path: Path,
    *,
    text: dict[str, Any],
    conditional: bool,
    seed: int = 0,
    top: dict[str, Any] | None = None,
    **save: Any,
) -> Path:
    """Write a random transformers checkpoint (ForConditionalGeneration or ForCausalLM) to path.

    top: extra top-level config keys of a ForConditionalGeneration (e.g. vision token ids).
    """
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5TextConfig,
    )

    torch.manual_seed(seed)
    if conditional:
        config = Qwen3_5Config(text_config=text, vision_config=VISION_TINY, **(top or {}))
        model = Qwen3_5ForConditionalGeneration(config)
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    _randomise(model, seed)
    model.save_pretrained(path, **save)
    return path


@pytest.fixture(scope="session")
def causal_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3_5ForCausalLM layout (`model.*`), 4 layers."""
    return write_checkpoint(tmp_path_factory.mktemp("causal"), text=TEXT_SMALL, conditional=False)


@pytest.fixture(scope="session")
def conditional_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3_5ForConditionalGeneration layout (`model.language_model.*`, tiny vision), 8 layers."""
    return write_checkpoint(
        tmp_path_factory.mktemp("conditional"), text=TEXT_WIDE, conditional=True, seed=1
    )


# in-vocabulary vision token ids, so that transformers can embed the prompts of these checkpoints
VISION_TOKEN_IDS = {
    "image_token_id": 300,
    "video_token_id": 301,
    "vision_start_token_id": 302,
    "vision_end_token_id": 303,
}


@pytest.fixture(scope="session")
def mm_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like conditional_ckpt, with vision token ids inside the 320-token vocabulary."""
    path = tmp_path_factory.mktemp("mm")
    return write_checkpoint(path, text=TEXT_WIDE, conditional=True, seed=3, top=VISION_TOKEN_IDS)


class PagedRunner:
    """A minimal engine for tests: paged KV in shuffled blocks, one state slot per sequence."""

    def __init__(
        self,
        model: Qwen3_8ForCausalLM,
        *,
        max_lens: Sequence[int],
        block_size: int = 16,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        device = model.lm_head.weight.device
        self.device = device
        counts = [math.ceil(n / block_size) for n in max_lens]
        order = torch.randperm(sum(counts) + 1, generator=torch.Generator().manual_seed(seed))
        ids = [b for b in order.tolist() if b != 0]  # block 0 never used: a stray write shows
        self.tables, start = [], 0
        for n in counts:
            self.tables.append(ids[start : start + n])
            start += n
        self.slots = [len(max_lens) - i for i in range(len(max_lens))]  # slot 0 stays unused
        self.caches = allocate_caches(
            model.cache_spec(),
            num_blocks=sum(counts) + 1,
            block_size=block_size,
            num_slots=len(max_lens) + 1,
            device=device,
        )
        self.cached = [0] * len(max_lens)

    def step(self, chunks: Sequence[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        """Run one step over (sequence index, new token ids) pairs; logits [n, V] per pair."""
        seqs = [s for s, _ in chunks]
        batch = ForwardBatch.build(
            [len(t) for _, t in chunks],
            [self.cached[s] for s in seqs],
            [self.tables[s] for s in seqs],
            [self.slots[s] for s in seqs],
            caches=self.caches,
            block_size=self.block_size,
            device=self.device,
        )
        ids = torch.cat([t for _, t in chunks]).to(self.device)
        logits = self.model.compute_logits(self.model(ids, batch))
        for s, t in chunks:
            self.cached[s] += len(t)
        return list(logits.cpu().split([len(t) for _, t in chunks]))


@pytest.fixture(scope="session")
def paged_runner() -> type[PagedRunner]:
    """The PagedRunner class (test modules are not importable under --import-mode=importlib)."""
    return PagedRunner
