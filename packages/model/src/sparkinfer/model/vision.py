"""The vision tower (`model.visual`): patch embedding, learned and rotary 2-D positions, pre-LN ViT
blocks with bidirectional attention per frame group, and the 2x2 patch merger (docs/model.md §9).

Input rows are the processor's 1536-value patch vectors in merge-block order; output rows are one
`out_hidden_size` embedding per 2x2 block, in the order their pad tokens appear in the prompt.
Parameter names are the checkpoint's, below the `model.visual.` prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.kernels.rotary import apply_rotary, apply_rotary_ref
from sparkinfer.model.config import VisionConfig
from sparkinfer.model.errors import CheckpointError, UnsupportedCheckpoint
from torch import nn

VISION_PREFIX = "model.visual."
_ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
LAYER_NORM_EPS = 1e-6


def patch_positions(grid_thw: Sequence[tuple[int, int, int]], merge_size: int) -> torch.Tensor:
    """(row, col) of every patch in merge-block order, repeated per temporal group: [N, 2] int64."""
    out = []
    for t, h, w in grid_thw:
        rows = torch.arange(h).view(h // merge_size, merge_size, 1, 1)
        cols = torch.arange(w).view(1, 1, w // merge_size, merge_size)
        rows = rows.expand(-1, -1, w // merge_size, merge_size).permute(0, 2, 1, 3).reshape(-1)
        cols = cols.expand(h // merge_size, merge_size, -1, -1).permute(0, 2, 1, 3).reshape(-1)
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    return torch.cat(out)


def pos_embed_taps(
    grid_thw: Sequence[tuple[int, int, int]], side: int, merge_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (align_corners=True) taps into the side x side learned grid for every patch.

    Returns (indices [N, 4] int64 into the flattened table, weights [N, 4] fp32).
    """
    pos = patch_positions(grid_thw, merge_size)
    sizes = torch.cat([torch.tensor([[h, w]]).expand(t * h * w, 2) for t, h, w in grid_thw])
    # align_corners=True: index i of n maps to i * (side - 1) / (n - 1)
    src = pos.float() * (side - 1) / (sizes - 1).clamp(min=1).float()  # [N, 2]
    lo = src.floor()
    frac = src - lo
    lo = lo.long()
    hi = (lo + 1).clamp(max=side - 1)
    (r0, c0), (r1, c1) = lo.unbind(-1), hi.unbind(-1)
    fr, fc = frac.unbind(-1)
    indices = torch.stack([r0 * side + c0, r0 * side + c1, r1 * side + c0, r1 * side + c1], -1)
    weights = torch.stack([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc], -1)
    return indices, weights


def segment_lengths(grid_thw: Sequence[tuple[int, int, int]]) -> list[int]:
    """Attention segments: one per temporal group of each image or video, h * w patches each."""
    return [h * w for t, h, w in grid_thw for _ in range(t)]


def segment_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg_lens: Sequence[int],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional attention inside each segment, one SDPA call per segment (the reference).

    q, k, v: [N, H, D] with segments of `seg_lens` rows back to back; returns [N, H, D].
    `cu_seqlens` (the fast path's device offsets) is not needed here.
    """
    out = torch.empty_like(q)
    start = 0
    for length in seg_lens:
        s = slice(start, start + length)
        # [1, H, L, D] per segment; no mask: every patch sees its whole frame group
        o = F.scaled_dot_product_attention(
            q[s].transpose(0, 1)[None], k[s].transpose(0, 1)[None], v[s].transpose(0, 1)[None],
            scale=scale,
        )  # fmt: skip
        out[s] = o[0].transpose(0, 1)
        start += length
    return out


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg_lens: Sequence[int],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """`segment_attention_ref`'s result in one launch for every segment of the call.

    Segments of one length (an image, or the frame groups of one video) run as one batched SDPA
    call ([segments, H, L, D]: its flash kernel is faster than the varlen one on long
    segments). Segments of several lengths run in one packed variable-length launch (torch's
    flash varlen attention) where it runs: CUDA, bf16 or fp16, and the default scale
    1/sqrt(D), with `cu_seqlens` (the segments' int32 offsets on the device) made here unless
    given. Elsewhere, the per-segment reference."""
    if seg_lens and all(n == seg_lens[0] for n in seg_lens):
        return _batched_attention(q, k, v, len(seg_lens), scale=scale)
    varlen = _varlen_attn()
    is_packed = (
        varlen is not None
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and abs(scale - q.shape[-1] ** -0.5) < 1e-12
        and len(seg_lens) > 0
    )
    if not is_packed:
        return segment_attention_ref(q, k, v, seg_lens, scale=scale)
    assert varlen is not None
    if cu_seqlens is None:
        cu_seqlens = segment_offsets(seg_lens, q.device)
    longest = max(seg_lens)
    try:
        out = varlen(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, cu_seqlens,
                     longest, longest)  # fmt: skip
    except (RuntimeError, TypeError):  # a build without flash varlen for this head dim or GPU
        return segment_attention_ref(q, k, v, seg_lens, scale=scale)
    return out[0] if isinstance(out, tuple) else out


def segment_offsets(seg_lens: Sequence[int], device: torch.device) -> torch.Tensor:
    """[0, len0, len0 + len1, ...] as int32 on `device`: the varlen launch's cu_seqlens."""
    lens = torch.tensor([0, *seg_lens], dtype=torch.int32)
    return lens.cumsum(0, dtype=torch.int32).to(device, non_blocking=True)


def _batched_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_segments: int, *, scale: float
) -> torch.Tensor:
    """Attention inside each of `num_segments` equal segments of q, k, v [N, H, D]: one SDPA
    call over [segments, H, L, D] views."""
    n, h, d = q.shape

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(num_segments, n // num_segments, h, d).transpose(1, 2)

    o = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), scale=scale)
    return o.transpose(1, 2).reshape(n, h, d)


def _varlen_attn() -> Callable[..., Any] | None:
    """torch.nn.attention.varlen.varlen_attn, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@dataclass(frozen=True)
class TowerPlan:
    """A tower call's inputs besides its pixels, on the device: bilinear taps into the learned
    position grid, rotary cos/sin per patch, and the attention segments."""

    grids: tuple[tuple[int, int, int], ...]
    pos_idx: torch.Tensor  # [N, 4] int64
    pos_weights: torch.Tensor  # [N, 4] fp32
    cos: torch.Tensor  # [N, head_dim] fp32
    sin: torch.Tensor
    seg_lens: tuple[int, ...]
    cu_seqlens: torch.Tensor  # [segments + 1] int32: segment offsets for the varlen launch

    @property
    def num_patches(self) -> int:
        return sum(self.seg_lens)


class VisionRotary(nn.Module):
    """2-D rotary over the whole head dim: angles [row * f, col * f], duplicated (model.md §9)."""

    inv_freq: torch.Tensor  # [head_dim / 4] fp32 buffer

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        spatial_dim = head_dim // 2
        exponents = torch.arange(0, spatial_dim, 2, dtype=torch.float) / spatial_dim
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N, 2] (row, col) -> (cos, sin), each [N, head_dim] fp32."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # [N, 2, D/4]
        freqs = freqs.flatten(1)  # [N, D/2]: row frequencies, then column frequencies
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


class PatchEmbed(nn.Module):
    """`proj` is the checkpoint's Conv3d with kernel = stride; applied as a linear over patches."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel, kernel, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, C * tp * p * p] -> [N, hidden]."""
        weight = self.proj.weight.view(self.proj.out_channels, -1)
        return F.linear(x.to(weight.dtype), weight, self.proj.bias)


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention inside each segment, rotary on q and k."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        seg_lens: list[int],
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [N, hidden], cos/sin [N, head_dim] fp32, segments summing to N -> [N, hidden]."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)  # [N, H, D]
        # in place, in fp32: one fused launch on a GPU (x*cos + rotate_half(x)*sin, model.md §9)
        rotate = apply_rotary if q.is_cuda else apply_rotary_ref
        q, k = rotate(q, k, cos, sin)
        out = segment_attention(q, k, v, seg_lens, scale=self.scale, cu_seqlens=cu_seqlens)
        return self.proj(out.reshape(n, -1))


class VisionMLP(nn.Module):
    """linear_fc1 -> GELU (tanh approximation for gelu_pytorch_tanh) -> linear_fc2."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.approximate = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, hidden]."""
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    """x += attn(norm1(x)); x += mlp(norm2(x))."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        seg_lens: list[int],
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[N, hidden] -> [N, hidden]; attention stays inside each segment."""
        x = x + self.attn(self.norm1(x), cos, sin, seg_lens, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm per patch, then each 2x2 block's 4 patches concatenated -> fc1 -> GELU -> fc2."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.norm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.linear_fc1 = nn.Linear(self.merged_size, self.merged_size, bias=True)
        self.linear_fc2 = nn.Linear(self.merged_size, config.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, hidden] patches in merge-block order -> [N / 4, out_hidden_size]."""
        x = self.norm(x).view(-1, self.merged_size)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """Qwen3.5 / Qwen3.8 vision tower (`Qwen3_5VisionModel` in transformers)."""

    def __init__(
        self,
        config: VisionConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_supported(config)
        self.config = config
        self.merge_size = config.spatial_merge_size
        self.num_grid_per_side = int(config.num_position_embeddings**0.5)
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.rotary = VisionRotary(config.hidden_size // config.num_heads, config.rope_theta)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        self.to(device=device, dtype=dtype)
        self.rotary.inv_freq = self.rotary.inv_freq.float()

    @torch.inference_mode()
    def forward(
        self, pixel_values: torch.Tensor, grid_thw: Sequence[tuple[int, int, int]]
    ) -> torch.Tensor:
        """Embed images and videos for the language model.

        Args:
            pixel_values: [N, C * tp * p * p] patch vectors of every item, concatenated in prompt
                order (float32 from the processor; cast to the tower's dtype here).
            grid_thw: (t, h, w) in patches of each item; sum of t * h * w must equal N.
        Returns:
            [N / merge_size**2, out_hidden_size] in the tower's dtype, one row per pad token.
        """
        plan = self.plan(grid_thw)
        self._check_input(pixel_values, list(plan.grids))
        return self.encode(pixel_values.to(self.pos_embed.weight.device), plan)

    def plan(self, grid_thw: Sequence[tuple[int, int, int]]) -> TowerPlan:
        """The positions a call over these grids needs, on the tower's device (host work)."""
        grids = tuple((int(t), int(h), int(w)) for t, h, w in grid_thw)
        self._check_grids(grids)
        device = self.pos_embed.weight.device
        idx, w = pos_embed_taps(grids, self.num_grid_per_side, self.merge_size)
        cos, sin = self.rotary(patch_positions(grids, self.merge_size).to(device))
        seg_lens = tuple(segment_lengths(grids))
        return TowerPlan(
            grids, idx.to(device), w.to(device), cos, sin, seg_lens,
            segment_offsets(seg_lens, device),
        )  # fmt: skip

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, plan: TowerPlan) -> torch.Tensor:
        """`forward` on patches already on the device: device work only, with no host sync, so
        a CUDA graph can hold it (the scheduler keeps one per grid)."""
        x = self.patch_embed(pixel_values)
        pos = (self.pos_embed(plan.pos_idx) * plan.pos_weights[..., None]).sum(1)  # fp32
        x = x + pos.to(x.dtype)
        seg_lens = list(plan.seg_lens)
        for block in self.blocks:
            x = block(x, plan.cos, plan.sin, seg_lens, plan.cu_seqlens)
        return self.merger(x)

    def _check_input(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]) -> None:
        patch_dim = self.patch_embed.proj.weight[0].numel()
        total = sum(t * h * w for t, h, w in grids)
        if pixel_values.dim() != 2 or pixel_values.shape != (total, patch_dim):
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; grid_thw {grids} needs "
                f"[{total}, {patch_dim}]"
            )

    def _check_grids(self, grids: Sequence[tuple[int, int, int]]) -> None:
        for t, h, w in grids:
            if min(t, h, w) < 1 or h % self.merge_size or w % self.merge_size:
                raise ValueError(
                    f"grid_thw entry {(t, h, w)}: h and w must be positive multiples of "
                    f"{self.merge_size}"
                )

    @torch.no_grad()
    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], *, prefix: str = VISION_PREFIX
    ) -> None:
        """Copy checkpoint tensors named `<prefix><parameter name>` into the tower.

        Raises CheckpointError for an unexpected name, a wrong shape or a missing parameter.
        """
        params = dict(self.named_parameters())
        seen: set[str] = set()
        for name, tensor in weights:
            key = name.removeprefix(prefix)
            param = params.get(key)
            if param is None:
                raise CheckpointError(
                    f"{name} is not a vision tower parameter: the checkpoint does not match "
                    f"its vision_config"
                )
            if param.shape != tensor.shape:
                raise CheckpointError(
                    f"{name} has shape {tuple(tensor.shape)}; vision_config expects "
                    f"{tuple(param.shape)}: the checkpoint does not match its config"
                )
            param.copy_(tensor)
            seen.add(key)
        if missing := sorted(params.keys() - seen):
            raise CheckpointError(
                f"{len(missing)} vision tower tensors are missing, e.g. {prefix}{missing[0]}: "
                f"the checkpoint is incomplete"
            )


def merge_vision_embeddings(
    inputs_embeds: torch.Tensor, is_vision: torch.Tensor, vision_embeds: torch.Tensor
) -> torch.Tensor:
    """Write vision rows into the pad-token rows of token embeddings, in order.

    Args:
        inputs_embeds: [T, hidden] token embeddings of one step.
        is_vision: [T] bool, True at `<|image_pad|>` / `<|video_pad|>` tokens.
        vision_embeds: [n, hidden] with n == is_vision.sum(): the tower's rows for exactly
            those pad tokens (a chunk may hold part of an item: slice the item's rows).
    Returns:
        inputs_embeds with the pad rows replaced (modified in place).
    """
    count = int(is_vision.sum())
    if count != vision_embeds.shape[0]:
        raise ValueError(
            f"the step has {count} vision pad tokens but {vision_embeds.shape[0]} vision "
            f"embeddings were given"
        )
    inputs_embeds[is_vision] = vision_embeds.to(inputs_embeds.dtype)
    return inputs_embeds


def _check_supported(config: VisionConfig) -> None:
    if config.deepstack_visual_indexes:
        raise UnsupportedCheckpoint(
            f"vision_config.deepstack_visual_indexes is {list(config.deepstack_visual_indexes)}; "
            f"Qwen3.5 / Qwen3.8 towers have none and DeepStack is not implemented"
        )
    if config.hidden_act not in _ACTIVATIONS:
        raise UnsupportedCheckpoint(
            f"vision_config.hidden_act is {config.hidden_act!r}; supported: "
            f"{', '.join(_ACTIVATIONS)}"
        )
    head_dim = config.hidden_size // config.num_heads
    side = int(config.num_position_embeddings**0.5)
    if head_dim % 4 or side * side != config.num_position_embeddings:
        raise UnsupportedCheckpoint(
            f"vision_config head_dim {head_dim} must be a multiple of 4 and "
            f"num_position_embeddings {config.num_position_embeddings} a square"
        )
    if config.in_channels != 3:
        raise UnsupportedCheckpoint(f"vision_config.in_channels is {config.in_channels}; need 3")
