"""The embedded model's architecture: Qwen3.8's text model in small, with a tiny vision tower."""

from __future__ import annotations

from typing import Any

from sparkinfer.model.embedded import RANDOM_CONFIG
from sparkinfer.model.tokenizer import QWEN_CONTROL_TOKENS

HIDDEN_SIZE = 320


def text_config(vocab_size: int, control_ids: dict[str, int]) -> dict[str, Any]:
    """8 layers in the 3:1 Gated-DeltaNet / gated-attention pattern, hidden 320, GQA 4:2,
    gated q, partial rotary (a quarter of each head), (1+w) norms, tied embeddings."""
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 1024,
        "num_hidden_layers": 8,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "attn_output_gate": True,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "eos_token_id": control_ids["<|endoftext|>"],
        "pad_token_id": control_ids["<|endoftext|>"],
        "bos_token_id": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],  # 8 frequencies over 16 rotary dims
            "mrope_interleaved": True,
        },
    }


# The random model's tiny tower (2 blocks, width 32, real patch geometry), projecting to the
# text model's width.
VISION_CONFIG: dict[str, Any] = {**RANDOM_CONFIG["vision_config"], "out_hidden_size": HIDDEN_SIZE}


def checkpoint_config(text: dict[str, Any], control_ids: dict[str, int]) -> dict[str, Any]:
    """config.json of the whole checkpoint (`qwen3_5`: text, vision tower, media token ids)."""
    assert set(QWEN_CONTROL_TOKENS) <= set(control_ids)
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": control_ids["<|image_pad|>"],
        "video_token_id": control_ids["<|video_pad|>"],
        "vision_start_token_id": control_ids["<|vision_start|>"],
        "vision_end_token_id": control_ids["<|vision_end|>"],
        "tie_word_embeddings": True,
        "text_config": text,
        "vision_config": VISION_CONFIG,
    }
