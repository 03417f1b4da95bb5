"""Roofline of the hybrid model from its config: bytes and FLOPs per step, and the measured peaks.

Decode is bandwidth-bound: every step reads all matmul weights once (the embedding table only one
row per token), each sequence's KV up to its context, and reads and writes its Gated-DeltaNet state.
Prefill is compute-bound: 2 FLOPs per matmul weight per token plus causal attention. The vision
tower is compute-bound the same way, with bidirectional attention inside each frame group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sparkinfer.bench.timing import time_at_power_cap, time_back_to_back
from sparkinfer.model.config import TextConfig, VisionConfig


@dataclass(frozen=True)
class Peaks:
    """Measured device peaks: copy bandwidth (bytes read + written per second) and bf16 matmul.

    `matmul_flop_s` is the rate of a burst of matmuls; `capped_matmul_flop_s` the rate they keep
    at the GPU's power cap (None where not measured: CPU devices, older records). A prompt's
    forward runs at the cap from its first milliseconds, so its roofline takes the second.
    """

    copy_bytes_s: float
    matmul_flop_s: float
    capped_matmul_flop_s: float | None = None

    @property
    def prefill_matmul_flop_s(self) -> float:
        """The matmul rate a prompt's forward can keep: at the power cap where measured."""
        return self.capped_matmul_flop_s or self.matmul_flop_s


def matmul_params(cfg: TextConfig) -> int:
    """Weights touched by every token's matmuls: all layers plus lm_head (not the embedding)."""
    h = cfg.hidden_size
    attn = (
        h * 2 * cfg.num_attention_heads * cfg.head_dim  # q_proj with its output gate
        + 2 * h * cfg.num_key_value_heads * cfg.head_dim
        + cfg.num_attention_heads * cfg.head_dim * h
    )
    gdn = (
        h * cfg.linear_conv_dim  # in_proj_qkv
        + 2 * h * cfg.linear_value_dim  # in_proj_z and out_proj
        + 2 * h * cfg.linear_num_value_heads  # in_proj_a and in_proj_b
    )
    mlp = 3 * h * cfg.intermediate_size
    num_full = len(cfg.full_attention_layers)
    num_linear = len(cfg.linear_attention_layers)
    return num_full * attn + num_linear * gdn + cfg.num_hidden_layers * mlp + cfg.vocab_size * h


def kv_bytes_per_token(cfg: TextConfig, dtype_bytes: int = 2) -> int:
    num_full = len(cfg.full_attention_layers)
    return num_full * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes


def state_bytes_per_seq(cfg: TextConfig, dtype_bytes: int = 2) -> int:
    """fp32 recurrent state plus the conv window, over all Gated-DeltaNet layers."""
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = (cfg.linear_conv_kernel_dim - 1) * cfg.linear_conv_dim * dtype_bytes
    return len(cfg.linear_attention_layers) * (rec + conv)


def decode_bytes_per_step(
    cfg: TextConfig, *, batch: int, context: int, weight_bytes: int | None = None
) -> int:
    """HBM traffic of one decode step of `batch` sequences at `context` tokens each.

    weight_bytes: the matmul weights' bytes as stored (FP8 layers: e4m3 plus their scales);
    None: bf16 weights of the config's shapes.
    """
    stored = 2 * matmul_params(cfg) if weight_bytes is None else weight_bytes
    weights = stored + batch * 2 * cfg.hidden_size
    per_seq = context * kv_bytes_per_token(cfg) + 2 * state_bytes_per_seq(cfg)
    return weights + batch * per_seq


def attention_flops_per_token(cfg: TextConfig, context: int) -> float:
    """QK and PV over `context` keys, all full-attention layers."""
    per_layer = 2 * 2 * cfg.num_attention_heads * cfg.head_dim * context
    return float(len(cfg.full_attention_layers) * per_layer)


def gdn_flops_per_token(cfg: TextConfig) -> float:
    """Delta-rule state read, update and read-out: ~6 K x V multiply-adds per value head."""
    k, v = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return float(len(cfg.linear_attention_layers) * 6 * cfg.linear_num_value_heads * k * v)


def decode_roofline_tok_s(
    cfg: TextConfig,
    peaks: Peaks,
    *,
    batch: int,
    context: int,
    weight_bytes: int | None = None,
) -> float:
    """Aggregate decode tok/s: the slower of streaming the bytes and doing the FLOPs (FLOPs at
    the bf16 rate: decode is bound by the bytes either way)."""
    step_bytes = decode_bytes_per_step(cfg, batch=batch, context=context, weight_bytes=weight_bytes)
    mem_s = step_bytes / peaks.copy_bytes_s
    flops = batch * (
        2 * matmul_params(cfg) + attention_flops_per_token(cfg, context) + gdn_flops_per_token(cfg)
    )
    return batch / max(mem_s, flops / peaks.matmul_flop_s)


def prefill_roofline_tok_s(cfg: TextConfig, peaks: Peaks, *, prompt_len: int) -> float:
    """Prompt tok/s at the sustained matmul rate (`Peaks.prefill_matmul_flop_s`); causal
    attention sees (L + 1) / 2 keys on average.

    Only the last prompt token goes through lm_head, so the head is left out per token.
    """
    per_token = (
        2 * (matmul_params(cfg) - cfg.vocab_size * cfg.hidden_size)
        + attention_flops_per_token(cfg, (prompt_len + 1) // 2)
        + gdn_flops_per_token(cfg)
    )
    return peaks.prefill_matmul_flop_s / per_token


def vision_flops(cfg: VisionConfig, grid_thw: Sequence[tuple[int, int, int]]) -> float:
    """FLOPs of one vision tower forward over these items (matmuls and attention; docs/model.md §9).

    Per patch: the patch embedding, then per block qkv, proj, fc1 and fc2; per merged token the
    merger's two matmuls. Attention is 4 * L^2 * hidden per block for each segment of L patches.
    """
    hidden, inter, merge = cfg.hidden_size, cfg.intermediate_size, cfg.spatial_merge_size
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    merged = hidden * merge**2
    num_patches = sum(t * h * w for t, h, w in grid_thw)
    seg_sq = sum(t * (h * w) ** 2 for t, h, w in grid_thw)
    per_patch = patch_dim * hidden + cfg.depth * (4 * hidden * hidden + 2 * hidden * inter)
    per_token = merged * merged + merged * cfg.out_hidden_size
    attention = cfg.depth * 4 * seg_sq * hidden
    return float(2 * num_patches * per_patch + 2 * num_patches // merge**2 * per_token + attention)


def measure_peaks(device: torch.device, *, copy_mib: int = 1024, matmul_n: int = 8192) -> Peaks:
    """Device-to-device copy bytes/s and `matmul_n`^3 bf16 matmul FLOP/s (`time_back_to_back`:
    medians over intervals of ten calls each, no host dispatch inside them), and on CUDA the
    matmul rate at the power cap (`time_at_power_cap`).

    On a CPU device the same figures come from host wall time (smoke runs only).
    """
    burst, capped = _matmul_rates(device, matmul_n)
    peaks = Peaks(_copy_rate(device, copy_mib), burst, capped)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the buffers are gone: hand their memory back for the model
    return peaks


def _copy_rate(device: torch.device, mib: int) -> float:
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_back_to_back(device, lambda: dst.copy_(src)).median_ms / 1e3
    return 2 * mib * 2**20 / seconds  # bytes read plus bytes written


def _matmul_rates(device: torch.device, n: int) -> tuple[float, float | None]:
    """(burst, at the power cap) FLOP/s of an n^3 bf16 matmul; the second is None off CUDA."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    flops = 2 * n**3

    def matmul() -> torch.Tensor:
        return torch.matmul(a, b)

    burst = flops / (time_back_to_back(device, matmul).median_ms / 1e3)
    if device.type != "cuda":
        return burst, None
    return burst, flops / (time_at_power_cap(device, matmul).median_ms / 1e3)
