"""Block drafter checkpoints for tests: the published configs, shrunk, with random weights.

PUBLISHED holds each layout's config.json fields as published (docs/model.md §17 gives the
sources); `shrink` keeps every field but scales the dimensions to a small target, and
`published_tensors` lists the tensor names and shapes those checkpoints ship, derived from the
config alone (not from sparkinfer's module), so loading is checked against the published names.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

_QWEN3_DRAFTER: dict[str, Any] = {
    "model_type": "qwen3",
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 5,
    "num_target_layers": 64,
    "vocab_size": 248320,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
PUBLISHED: dict[str, dict[str, Any]] = {
    "z-lab/Qwen3.5-27B-DFlash": {
        **_QWEN3_DRAFTER,
        "architectures": ["DFlashDraftModel"],
        "block_size": 16,
        "rope_theta": 10_000_000,
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    },
    "z-lab/Qwen3.6-27B-DFlash": {
        **_QWEN3_DRAFTER,
        "architectures": ["DFlashDraftModel"],
        "block_size": 16,
        "rope_theta": 10_000_000,
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
        "sliding_window": 2048,
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    },
    "Qwen3.8-27B-DFlash2": {
        **_QWEN3_DRAFTER,
        "architectures": ["DFlash2DraftModel"],
        "is_causal": False,
        "rope_parameters": {"rope_theta": 10_000_000, "rope_type": "default"},
        "layer_types": ["sliding_attention"] * 5,
        "sliding_window": 2048,
        "dflash_config": {
            "block_size": 8,
            "conv_group_size": 16,
            "conv_kernel_size": 2,
            "mask_token_id": 248070,
            "selector_rank": 256,
            "selector_top_k": 16,
            "target_layer_ids": [5, 19, 33, 47, 61],
        },
    },
    "RadixArk/Qwen3.8-27B-DSpark": {
        **_QWEN3_DRAFTER,
        "architectures": ["DSparkDraftModel"],
        "block_size": 7,
        "rope_theta": 10_000_000,
        "layer_types": ["full_attention"] * 5,
        "markov_rank": 256,
        "markov_head_type": "vanilla",
        "projector_type": "dspark",
        "attention_mode": "gqa",
        "mask_token_id": 248070,
        "target_layer_ids": [5, 19, 33, 47, 61],
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "dflash_config": {
            "mask_token_id": 248070,
            "target_layer_ids": [5, 19, 33, 47, 61],
            "markov_rank": 256,
        },
    },
}


def shrink(
    published: dict[str, Any], *, hidden: int, vocab: int, num_layers: int
) -> dict[str, Any]:
    """The published config for a target of `hidden`, `vocab` and `num_layers`: taps scaled to
    the target's depth, 6 heads of 8 dims (so heads * head_dim != hidden, as published), the
    window 5 and the small heads' ranks 8."""
    cfg = copy.deepcopy(published)
    scale = num_layers / cfg["num_target_layers"]
    small = {
        "hidden_size": hidden,
        "intermediate_size": 96,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": vocab,
        "num_target_layers": num_layers,
        "sliding_window": 5,
        "markov_rank": 8,
        "mask_token_id": vocab - 10,
        "selector_rank": 8,
        "selector_top_k": 4,
    }
    for where in (cfg, cfg.get("dflash_config", {})):
        for key, value in small.items():
            if key in where:
                where[key] = value
        if "target_layer_ids" in where:
            where["target_layer_ids"] = [int(i * scale) for i in where["target_layer_ids"]]
    return cfg


def published_tensors(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, as the layout's published checkpoints name them."""
    d = {**cfg, **cfg.get("dflash_config", {})}
    h, i, v = d["hidden_size"], d["intermediate_size"], d["vocab_size"]
    q, kv, hd = (
        d["num_attention_heads"] * d["head_dim"],
        d["num_key_value_heads"] * d["head_dim"],
        d["head_dim"],
    )
    arch = d["architectures"][0]
    out = {
        "fc.weight": (h, len(d["target_layer_ids"]) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for n in range(d["num_hidden_layers"]):
        p = f"layers.{n}."
        out |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }  # fmt: skip
        if arch == "DFlash2DraftModel":
            k, groups = d["conv_kernel_size"], h // d["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                out[p + conv + ".base_kernel"] = (2, k, h)
                out[p + conv + ".kernel_projection.weight"] = (2 * k * groups, h)
    if arch == "DFlash2DraftModel":
        r = d["selector_rank"]
        out |= {
            "candidate_selector.hidden_projection.weight": (r, h),
            "candidate_selector.predecessor_codebook": (v, r),
            "candidate_selector.successor_codebook": (v, r),
        }
    if arch == "DSparkDraftModel":
        r = d["markov_rank"]
        out |= {"markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r)}
        out |= {"confidence_head.proj.weight": (1, h + r), "confidence_head.proj.bias": (1,)}
    return out


def random_tensors(cfg: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the published names: norms near 1, the rest small."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in published_tensors(cfg).items():
        t = torch.randn(shape, generator=gen)
        tensors[name] = 1.0 + 0.1 * t if name.endswith("norm.weight") else 0.15 * t
    return tensors


def write_drafter(path: Path, cfg: dict[str, Any], *, seed: int = 0) -> Path:
    """A drafter checkpoint directory: config.json and model.safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(random_tensors(cfg, seed), str(path / "model.safetensors"))
    return path
