"""A tensor-parallel rank's model, filled from the checkpoint with only its own slices.

`build_sharded_model` builds the ordinary decoder at the rank's head and column counts
(`ShardPlan.local_text`), then swaps in the row-parallel projections and the vocabulary-parallel
embedding and head. `load_sharded_weights` reads each checkpoint tensor's rank slices straight
from the safetensors files (`get_slice`), so no rank ever holds the whole model. Vision and MTP
are not split: a sharded model serves text alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from sparkinfer.model.config import ModelConfig
from sparkinfer.model.decoder import DecoderLayer, Qwen3_8ForCausalLM
from sparkinfer.model.errors import CheckpointError, UnsupportedCheckpoint
from sparkinfer.model.parallel.group import TensorParallelGroup
from sparkinfer.model.parallel.layers import (
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
)
from sparkinfer.model.parallel.plan import ShardPlan
from sparkinfer.model.weights import Checkpoint, checkpoint_views, open_checkpoint

# A tensor's slice: the dimension it is cut along and the ranges of it this rank reads, in order.
Slice = tuple[int, tuple[range, ...]]
_VOCAB_PARALLEL = ("embed_tokens.weight", "lm_head.weight")


def build_sharded_model(
    config: ModelConfig,
    tp: TensorParallelGroup,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    num_real_tokens: int | None = None,
) -> Qwen3_8ForCausalLM:
    """Rank `tp.rank`'s model, its weights uninitialised; `model.config.text` holds its counts."""
    plan = ShardPlan(config.text, tp.rank, tp.size)
    local_text = plan.local_text()
    device = torch.device(device)
    # Built with a shard-sized vocabulary so the replaced embedding and head never exist whole.
    built = dataclasses.replace(
        config, text=dataclasses.replace(local_text, vocab_size=plan.vocab_shard_len), vision=None
    )
    model = Qwen3_8ForCausalLM(built, device=device, dtype=dtype, use_vision=False)
    model.config = dataclasses.replace(config, text=local_text, vision=None)
    dims = {"tp": tp, "ops": model.ops, "device": device, "dtype": dtype}
    hidden = local_text.hidden_size
    for layer in model.model.modules():
        if not isinstance(layer, DecoderLayer):
            continue
        if layer.is_linear:
            value_dim = local_text.linear_value_dim
            layer.linear_attn.register_module(
                "out_proj", RowParallelLinear(value_dim, hidden, **dims)
            )
        else:
            q_width = local_text.num_attention_heads * local_text.head_dim
            layer.self_attn.register_module("o_proj", RowParallelLinear(q_width, hidden, **dims))
        down_proj = RowParallelLinear(local_text.intermediate_size, hidden, **dims)
        layer.mlp.register_module("down_proj", down_proj)
    embed = VocabParallelEmbedding(
        plan.vocab, plan.vocab_shard_len, hidden, tp=tp, device=device, dtype=dtype
    )
    head = VocabParallelLMHead(
        config.text.vocab_size,
        plan.vocab_shard_len,
        hidden,
        num_real_tokens=num_real_tokens or config.text.vocab_size,
        **dims,
    )
    if config.text.tie_word_embeddings:
        head.weight = embed.weight
    # The attributes keep their names (and so the checkpoint's), only the modules change.
    model.model.register_module("embed_tokens", embed)
    model.register_module("lm_head", head)
    return model


def tensor_slice(name: str, plan: ShardPlan) -> Slice | None:
    """How rank `plan.rank` cuts the text tensor `name` (parameter naming); None: whole."""
    t = plan.text
    suffix = ".".join(name.split(".")[-2:])
    d, kd, vd = t.head_dim, t.linear_key_head_dim, t.linear_value_head_dim

    def heads(r: range, width: int, offset: int = 0) -> range:
        return range(offset + r.start * width, offset + r.stop * width)

    k_rows = heads(plan.k_heads, kd)
    gdn_channels = (k_rows, heads(plan.k_heads, kd, t.linear_key_dim))
    gdn_channels += (heads(plan.v_heads, vd, 2 * t.linear_key_dim),)
    table: dict[str, Slice] = {
        "q_proj.weight": (0, (heads(plan.q_heads, 2 * d),)),  # [q_h | gate_h] per head
        "k_proj.weight": (0, (heads(plan.kv_heads, d),)),
        "v_proj.weight": (0, (heads(plan.kv_heads, d),)),
        "o_proj.weight": (1, (heads(plan.q_heads, d),)),
        "in_proj_qkv.weight": (0, gdn_channels),
        "conv1d.weight": (0, gdn_channels),
        "in_proj_z.weight": (0, (heads(plan.v_heads, vd),)),
        "in_proj_b.weight": (0, (plan.v_heads,)),
        "in_proj_a.weight": (0, (plan.v_heads,)),
        "linear_attn.A_log": (0, (plan.v_heads,)),
        "linear_attn.dt_bias": (0, (plan.v_heads,)),
        "out_proj.weight": (1, (heads(plan.v_heads, vd),)),
        "gate_proj.weight": (0, (plan.intermediate,)),
        "up_proj.weight": (0, (plan.intermediate,)),
        "down_proj.weight": (1, (plan.intermediate,)),
        "embed_tokens.weight": (0, (plan.vocab,)),
        "lm_head.weight": (0, (plan.vocab,)),
    }
    return table.get(suffix)


def _read_slice(f: Any, stored_name: str, cut: Slice | None) -> torch.Tensor:
    """One tensor's slice from an open safetensors file (only those bytes are read)."""
    if cut is None:
        return f.get_tensor(stored_name)
    dim, ranges = cut
    part = f.get_slice(stored_name)
    index: list[slice] = [slice(None)] * len(part.get_shape())
    pieces = []
    for r in ranges:
        index[dim] = slice(r.start, r.stop)
        pieces.append(part[tuple(index)])
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


@torch.no_grad()
def load_sharded_weights(model: Qwen3_8ForCausalLM, ckpt: Checkpoint, plan: ShardPlan) -> None:
    """Copy this rank's slice of every text tensor of `ckpt` into `model`, shapes checked."""
    if ckpt.config.quantization is not None:
        raise UnsupportedCheckpoint(
            f"{ckpt.path} is an FP8 checkpoint; tensor parallel serves bf16 checkpoints for now: "
            "serve it with tensor_parallel_size 1, or a bf16 release"
        )
    views = checkpoint_views(model)
    refs = dict(ckpt.text)
    if ckpt.config.text.tie_word_embeddings:
        refs.pop("lm_head.weight", None)
    missing = sorted(set(views) - set(refs))
    if missing:
        raise CheckpointError(
            f"missing tensors {missing[:8]} in {ckpt.path}: the checkpoint does not match its "
            "config.json"
        )
    by_file: dict[Path, list[str]] = {}
    for name in views:
        by_file.setdefault(refs[name].file, []).append(name)
    for file, names in by_file.items():  # each file opened once
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in names:
                ref = refs[name]
                value = _read_slice(f, ref.name, tensor_slice(name, plan))
                _copy_slice(views[name], value, name=name, stored_name=ref.name, rank=plan.rank)


def _copy_slice(
    view: torch.Tensor, value: torch.Tensor, *, name: str, stored_name: str, rank: int
) -> None:
    # A vocabulary shard's tail rows past the vocabulary stay zero.
    target = view[: value.shape[0]] if name.endswith(_VOCAB_PARALLEL) else view
    if tuple(value.shape) != tuple(target.shape):
        raise CheckpointError(
            f"tensor {stored_name}: rank {rank}'s slice has shape {list(value.shape)}; its "
            f"layer expects {list(target.shape)}: the checkpoint does not match its config"
        )
    target.copy_(value)


def load_sharded_model(
    path_or_id: str | Path,
    tp: TensorParallelGroup,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    num_real_tokens: int | None = None,
) -> Qwen3_8ForCausalLM:
    """Open the checkpoint, build rank `tp.rank`'s model and load its slices (text only)."""
    ckpt = open_checkpoint(path_or_id, progress=tp.rank == 0)
    model = build_sharded_model(
        ckpt.config, tp, device=device, dtype=dtype, num_real_tokens=num_real_tokens
    )
    load_sharded_weights(model, ckpt, ShardPlan(ckpt.config.text, tp.rank, tp.size))
    return model
