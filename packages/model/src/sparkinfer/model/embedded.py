"""The two built-in models, served offline with no download.

- `EMBEDDED_MODEL_ID`, the default (`sparkinfer-api` with no --model): a 15M-parameter code model
  of the Qwen3.8 architecture with its MTP head, trained for testing (not a general assistant),
  shipped as an HF-layout checkpoint in this package (`embedded_checkpoint/`, its model card says
  how it was made). Its own 8K byte-level BPE carries every Qwen control token; its tiny vision
  tower has random weights, so image and video requests run end to end but the model does not see
  them. Its DFlash block drafter ships beside it (`embedded_checkpoint/dflash/`, trained by
  self-distillation, packages/model/scripts/train_drafter/): `--draft-model embedded` (or
  `EMBEDDED_DRAFTER_ID`) selects it.
- `RANDOM_MODEL_ID`: a random-weight model of the Qwen3.8 shape with Qwen's real vocabulary and the
  248,320-row head (same config schema, 3:1 layer pattern, special-token ids, and a tiny vision
  tower with the real patch geometry). Its weights are seeded noise, so its output is meaningless
  but reproducible: for tests that need Qwen's ids or the full-size head.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import torch
from sparkinfer.model.config import GenerationDefaults, ModelConfig, parse_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.weights import checkpoint_views

EMBEDDED_MODEL_ID = "sparkinfer/qwen3.8-code-tiny"
RANDOM_MODEL_ID = "sparkinfer/qwen3.8-embedded-random"
BUILTIN_MODEL_IDS = (EMBEDDED_MODEL_ID, RANDOM_MODEL_ID)
EMBEDDED_DRAFTER_ID = "sparkinfer/qwen3.8-code-tiny-dflash"
EMBEDDED_DRAFTER_NAMES = ("embedded", EMBEDDED_DRAFTER_ID)  # what --draft-model accepts for it
RANDOM_SEED = 0
RANDOM_VISION_SEED = 1  # its own stream: the text weights do not depend on the tower
RANDOM_NUM_REAL_TOKENS = 248_077  # ids 248077..248319 are padding, as in Qwen3.8 (model.md §12)
WEIGHT_STD = 0.02  # small enough that activations stay O(1) through 8 layers


def embedded_checkpoint_dir() -> Path:
    """The folder of the default model's checkpoint, inside this package."""
    return Path(str(resources.files("sparkinfer.model") / "embedded_checkpoint"))


def embedded_drafter_dir() -> Path:
    """The folder of the default model's DFlash drafter, inside its checkpoint's folder."""
    return embedded_checkpoint_dir() / "dflash"


RANDOM_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
        + ["full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
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
        "tie_word_embeddings": False,
        "eos_token_id": 248044,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],  # 8 frequencies over 16 rotary dims
            "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "model_type": "qwen3_5_vision",
        "depth": 2,
        "hidden_size": 32,
        "num_heads": 2,
        "intermediate_size": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "num_position_embeddings": 64,  # an 8x8 learned grid
        "out_hidden_size": 256,
        "deepstack_visual_indexes": [],
    },
}  # fmt: skip

RANDOM_GENERATION_DEFAULTS = GenerationDefaults(
    temperature=1.0, top_k=20, top_p=0.95, eos_token_ids=(248046, 248044)
)


def random_model_config() -> ModelConfig:
    """The random model's parsed config."""
    return parse_model_config(RANDOM_CONFIG)


def _random_value(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Deterministic fp32 CPU values for one checkpoint tensor, following transformers' init."""
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        return torch.ones(shape)
    if name.endswith("norm.weight"):  # (1+w) norms: w = 0 is the identity scale
        return torch.zeros(shape)
    return torch.empty(shape).normal_(0.0, WEIGHT_STD, generator=gen)


def _random_vision_value(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Vision tower values: LayerNorms start as the identity, biases at zero, weights noise."""
    if name.endswith("bias"):
        return torch.zeros(shape)
    if "norm" in name:
        return torch.ones(shape)
    return torch.empty(shape).normal_(0.0, WEIGHT_STD, generator=gen)


@torch.no_grad()
def build_random_model(
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    num_real_tokens: int | None = RANDOM_NUM_REAL_TOKENS,
) -> Qwen3_8ForCausalLM:
    """The random model with its seeded weights (same values on every device).

    Values are drawn per checkpoint tensor name (`weights.checkpoint_views`: parameter order, a
    fused parameter's parts in row order) into the rows each fills, so fused projections hold the
    same values as separate ones would.
    """
    model = Qwen3_8ForCausalLM(
        random_model_config(), device=device, dtype=dtype, num_real_tokens=num_real_tokens
    )
    gen = torch.Generator().manual_seed(RANDOM_SEED)
    for name, view in checkpoint_views(model).items():
        view.copy_(_random_value(name, view.shape, gen))
    if model.visual is not None:
        gen = torch.Generator().manual_seed(RANDOM_VISION_SEED)
        for name, param in model.visual.named_parameters():
            param.copy_(_random_vision_value(name, param.shape, gen))
    return model
