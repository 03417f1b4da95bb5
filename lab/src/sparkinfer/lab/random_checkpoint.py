"""A random-weight Qwen3.8 checkpoint folder, MTP head included, written tensor by tensor.

What `sparkinfer-api --model FOLDER` loads: config.json in the text-only layout (`qwen3_5_text`,
Qwen3_5ForCausalLM), generation_config.json, and safetensors shards with an index (the
embedding, one shard per decoder layer, the final norm with the LM head, the MTP head's `mtp.*`
tensors in Qwen's names). No tokenizer.json: the loader then serves Qwen's own 248,077-id
vocabulary shipped with the model package (`Tokenizer.from_checkpoint`), which fits the 248,320
rows of the 27B config.

Names and shapes come from the model built on the meta device (`weights.checkpoint_views`, and
the MTP head's parameters with its fused projections split as `weights.fused_parameters` lays
them out), so they are what the loader expects. Values follow the offline bench's
`engine.fill_random` rule (N(0, 0.02) matrices, (1 + w) norms at zero, the GDN norm and dt_bias
at one, A_log from U(1, 16)), drawn on `device` one shard at a time, so only one layer's tensors
are ever held on the host.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from sparkinfer.bench.engine import full_size_config
from sparkinfer.model.config import ModelConfig, TextConfig
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.mtp import MTP_PREFIX, MTPHead
from sparkinfer.model.weights import INDEX_FILE, checkpoint_views, fused_parameters

DTYPE = torch.bfloat16
WEIGHT_STD = 0.02  # as `sparkinfer.bench.engine.fill_random`
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_MTP_LAYER = "layers.0."


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: its name, shape and stored dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def num_bytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


def tiny_config() -> ModelConfig:
    """A tiny-width 4-layer model (3:1 pattern) with the 27B's vocabulary, for CPU checks: the
    tokenizer the folder gets is Qwen's."""
    cfg = full_size_config(4)
    text = replace(
        cfg.text, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32, mrope_section=(3, 3, 2),
    )  # fmt: skip
    return replace(cfg, text=text)


def config_json(text: TextConfig) -> dict[str, Any]:
    """config.json of a text-only checkpoint with an MTP head, as `parse_model_config` reads it."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "dtype": "bfloat16",
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.intermediate_size,
        "num_hidden_layers": text.num_hidden_layers,
        "layer_types": list(text.layer_types),
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "linear_num_key_heads": text.linear_num_key_heads,
        "linear_num_value_heads": text.linear_num_value_heads,
        "linear_key_head_dim": text.linear_key_head_dim,
        "linear_value_head_dim": text.linear_value_head_dim,
        "linear_conv_kernel_dim": text.linear_conv_kernel_dim,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": text.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "attn_output_gate": True,
        "tie_word_embeddings": text.tie_word_embeddings,
        "eos_token_id": list(text.eos_token_ids),
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": text.rope_theta,
            "partial_rotary_factor": text.partial_rotary_factor,
            "mrope_section": list(text.mrope_section),
            "mrope_interleaved": True,
        },
    }


def checkpoint_shards(config: ModelConfig) -> dict[str, list[TensorSpec]]:
    """Shard file name -> its tensors: the embedding, each layer, the norm and head, the MTP
    head (names and shapes from the model and head built on the meta device)."""
    model = Qwen3_8ForCausalLM(config, device="meta", dtype=DTYPE)
    shards: dict[str, list[TensorSpec]] = {}
    for name, view in checkpoint_views(model).items():
        layer = _LAYER.match(name)
        if layer is not None:
            shard = f"model-layer-{int(layer[1]):03d}.safetensors"
        elif "embed_tokens" in name:
            shard = "model-embed.safetensors"
        else:
            shard = "model-head.safetensors"
        shards.setdefault(shard, []).append(TensorSpec(name, tuple(view.shape), view.dtype))
    head = MTPHead(config.text, ops=model.ops, device=torch.device("meta"), dtype=DTYPE)
    fused = fused_parameters(config.text)
    mtp = shards.setdefault("model-mtp.safetensors", [])
    for name, param in head.named_parameters():
        parts = fused.get(name.removeprefix(_MTP_LAYER)) if name.startswith(_MTP_LAYER) else None
        if parts is None:
            mtp.append(TensorSpec(MTP_PREFIX + name, tuple(param.shape), param.dtype))
            continue
        for part in parts:
            shape = (part.num_rows, *param.shape[1:])
            mtp.append(TensorSpec(MTP_PREFIX + _MTP_LAYER + part.name, shape, param.dtype))
    return shards


def checkpoint_bytes(config: ModelConfig) -> int:
    """Bytes of every tensor the checkpoint of `config` stores."""
    return sum(s.num_bytes for specs in checkpoint_shards(config).values() for s in specs)


def random_value(spec: TensorSpec, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """One tensor's random value on `device`, by `fill_random`'s rule for its name."""
    name = spec.name
    if name.endswith("A_log"):
        value = torch.empty(spec.shape, device=device).uniform_(1.0, 16.0, generator=gen).log_()
        return value.to(spec.dtype)
    if name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        return torch.ones(spec.shape, dtype=spec.dtype, device=device)
    if "norm" in name:  # (1 + w) norms: w = 0 is the identity scale
        return torch.zeros(spec.shape, dtype=spec.dtype, device=device)
    value = torch.empty(spec.shape, dtype=spec.dtype, device=device)
    return value.normal_(0.0, WEIGHT_STD, generator=gen)


@torch.no_grad()
def write_random_checkpoint(
    folder: Path,
    config: ModelConfig,
    *,
    device: torch.device,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> int:
    """Write random safetensors shards of `config`, their index, generation_config.json and, last,
    config.json into `folder` (created); returns the bytes of tensors written. `log` gets one
    line per shard."""
    folder.mkdir(parents=True, exist_ok=True)
    text = config.text
    generation = {"eos_token_id": list(text.eos_token_ids), "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    gen = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    total = 0
    shards = checkpoint_shards(config)
    for i, (shard, specs) in enumerate(shards.items()):
        tensors = {s.name: random_value(s, gen, device).cpu() for s in specs}
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        size = sum(s.num_bytes for s in specs)
        total += size
        weight_map |= dict.fromkeys(tensors, shard)
        log(f"wrote {shard} ({i + 1}/{len(shards)}, {size / 1e9:.2f} GB)")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    # Last: a folder with config.json is whole (`serve_speculation --checkpoint` reuses it).
    (folder / "config.json").write_text(json.dumps(config_json(text), indent=2) + "\n")
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the server started next gets the memory back
    return total
