"""FP8 weights: which linear layers hold block-scaled e4m3, from a Qwen FP8 checkpoint or
quantized on load from a bf16 one, and the checkpoint views of their parameters.

Qwen's FP8 releases (Qwen3-Next, Qwen3.5, Qwen3.8 `-FP8`: `quant_method: fp8`, `fmt: e4m3`,
`weight_block_size: [128, 128]`, dynamic activations) store every decoder projection as
float8_e4m3fn `X.weight` with fp32 `X.weight_scale_inv` [ceil(N/128), ceil(K/128)] beside it,
and keep in bf16 what `modules_to_not_convert` lists: norms, `linear_attn.{conv1d, A_log,
dt_bias, norm}`, the small gate projections `linear_attn.in_proj_a`/`in_proj_b` (Qwen3-Next's
fused `in_proj_ba`), `lm_head`, the embeddings (not a linear layer), the vision tower and the MTP
head's fc and norms. FP8 on load quantizes exactly the tensors `QUANTIZED_ON_LOAD` names, each
on its own (the same 128x128 blocks, scale = amax / 448), so one kernel path serves both.

Fused parameters (weights.fused_parameters) stack parts by rows. A fused layer is FP8 when its
FP8 parts come first (in_proj: [in_proj_qkv | in_proj_z] e4m3, then [in_proj_b | in_proj_a] in
the layer's `tail_weight`); the parts' block scales are stacked the same way, which is exact only
when each FP8 part but the last has a multiple of 128 rows (true of every Qwen3.5/3.8 shape). A
checkpoint whose FP8 parts break that is refused, naming the part; FP8 on load keeps such a
layer in bf16 (logged).

Vision and MTP tensors stored in FP8 are dequantized on load (`dequantize_group`): those heads
run in the model dtype.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from sparkinfer.kernels.fp8_linear.ref import dequantize_weight_fp8, quantize_weight_fp8
from sparkinfer.model.config import FP8_BLOCK, TextConfig
from sparkinfer.model.errors import CheckpointError
from sparkinfer.model.layers.linear import Linear
from torch import nn

FP8_SAFETENSORS_DTYPE = "F8_E4M3"
SCALE_SUFFIX = "_scale_inv"  # X.weight -> X.weight_scale_inv
# The checkpoint tensors FP8 on load quantizes: every decoder projection but the GDN gates.
QUANTIZED_ON_LOAD = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
    r"|mlp\.(gate|up|down)_proj)\.weight$"
)
_LAYER_MODULE = re.compile(r"^(model\.layers\.\d+\.)(.+)$")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fp8Part:
    """One checkpoint tensor of an FP8 layer: its name, rows, and where its rows live."""

    name: str
    num_rows: int
    is_fp8: bool


def scale_name(weight_name: str) -> str:
    return weight_name + SCALE_SUFFIX


def _layer_parts(
    text: TextConfig, fused: Mapping[str, tuple], module_name: str, linear: Linear
) -> list[tuple[str, int]] | None:
    """(checkpoint name, rows) of a decoder linear layer's parts in row order, or None."""
    match = _LAYER_MODULE.match(module_name)
    if match is None:
        return None
    parts = fused.get(match[2] + ".weight")
    if parts is None:
        return [(module_name + ".weight", linear.out_features)]
    return [(match[1] + p.name, p.num_rows) for p in parts]


def _is_fp8_in_checkpoint(name: str, text_refs: Mapping[str, object], keeps) -> bool:
    ref = text_refs.get(name)
    is_fp8 = getattr(ref, "dtype", None) == FP8_SAFETENSORS_DTYPE
    has_scale = scale_name(name) in text_refs
    if is_fp8 != has_scale:
        raise CheckpointError(
            f"tensor {name} is {'e4m3 without' if is_fp8 else 'not e4m3 but has'} a "
            f"{scale_name(name)}: an FP8 weight needs both; re-download or re-export the checkpoint"
        )
    if is_fp8 and keeps(name.removesuffix(".weight")):
        raise CheckpointError(
            f"tensor {name} is e4m3 but quantization_config.modules_to_not_convert lists "
            f"{name.removesuffix('.weight')}: the checkpoint contradicts its config.json"
        )
    return is_fp8


def use_fp8_layers(
    model: nn.Module,
    text: TextConfig,
    fused: Mapping[str, tuple],
    text_refs: Mapping[str, object],
    *,
    keeps,
    on_load: bool,
) -> set[str]:
    """Turn each decoder linear layer whose checkpoint parts are FP8 (or, `on_load`, are named by
    QUANTIZED_ON_LOAD) into an FP8 layer; returns the checkpoint names to quantize on load.

    keeps(module_name) -> bool: modules_to_not_convert of the checkpoint's config.
    """
    quantize: set[str] = set()
    for module_name, module in model.named_modules():
        if not isinstance(module, Linear):
            continue
        parts = _layer_parts(text, fused, module_name, module)
        if parts is None:
            continue
        if on_load:
            flags = [bool(QUANTIZED_ON_LOAD.match(n)) and not keeps(n[:-7]) for n, _ in parts]
        else:
            flags = [_is_fp8_in_checkpoint(n, text_refs, keeps) for n, _ in parts]
        num_fp8 = sum(flags)
        if not num_fp8:
            continue
        problem = _layout_problem(parts, flags)
        if problem is not None and not on_load:
            raise CheckpointError(f"{module_name}: {problem}; serve the bf16 checkpoint")
        if problem is not None:
            logger.warning("%s stays bf16 (not quantized on load): %s", module_name, problem)
            continue
        module.use_fp8(sum(rows for (_, rows), f in zip(parts, flags, strict=True) if f))
        if on_load:
            quantize.update(n for (n, _), f in zip(parts, flags, strict=True) if f)
    return quantize


def _layout_problem(parts: list[tuple[str, int]], flags: list[bool]) -> str | None:
    """Why these parts cannot be one FP8 layer (FP8 first, block-aligned), or None."""
    num_fp8 = sum(flags)
    if flags != [True] * num_fp8 + [False] * (len(flags) - num_fp8):
        return "its FP8 parts do not come before its bf16 parts in the fused row order"
    for name, rows in parts[: num_fp8 - 1]:
        if rows % FP8_BLOCK:
            return (
                f"part {name} has {rows} rows, not a multiple of {FP8_BLOCK}, so the next part's "
                "128-row scale blocks would not line up in the fused weight"
            )
    return None


def fp8_layer_views(
    module_name: str, linear: Linear, parts: list[tuple[str, int]]
) -> dict[str, torch.Tensor]:
    """Checkpoint name -> rows of the FP8 layer's weight, scales or tail, in row order."""
    assert linear.weight_scale_inv is not None, "an FP8 layer"
    views: dict[str, torch.Tensor] = {}
    fp8_rows, scale_row = 0, 0
    tail_row = 0
    for name, rows in parts:
        if fp8_rows < linear.weight.shape[0]:
            num_scale_rows = -(-rows // FP8_BLOCK)
            views[name] = linear.weight[fp8_rows : fp8_rows + rows]
            views[scale_name(name)] = linear.weight_scale_inv[
                scale_row : scale_row + num_scale_rows
            ]
            fp8_rows, scale_row = fp8_rows + rows, scale_row + num_scale_rows
        else:
            assert linear.tail_weight is not None, f"{module_name}: rows past the FP8 part"
            views[name] = linear.tail_weight[tail_row : tail_row + rows]
            tail_row += rows
    return views


def quantized_on_load(name: str, tensor: torch.Tensor, device: torch.device) -> Iterator:
    """(name, e4m3 weight) and (name_scale_inv, scales) for a bf16 checkpoint tensor, quantized
    on `device` (the GPU, where the model lives, quantizes 27B in seconds)."""
    weight, scale = quantize_weight_fp8(tensor.to(device))
    yield name, weight
    yield scale_name(name), scale


def dequantize_group(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vision or MTP group with its FP8 weights (and their `_scale_inv`) as fp32 weights."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight" + SCALE_SUFFIX):
            continue
        scale = tensors.get(scale_name(name))
        if tensor.dtype == torch.float8_e4m3fn:
            if scale is None:
                raise CheckpointError(f"tensor {name} is e4m3 without {scale_name(name)}")
            tensor = dequantize_weight_fp8(tensor, scale.float())
        out[name] = tensor
    return out


def fp8_views_by_parameter(
    model: nn.Module, text: TextConfig, fused: Mapping[str, tuple]
) -> dict[str, dict[str, torch.Tensor]]:
    """For each parameter of an FP8 decoder layer, the checkpoint views it holds: the layer's
    `weight` maps to all of them (`fp8_layer_views`), its scales and tail to none."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, Linear) or not module.is_fp8:
            continue
        parts = _layer_parts(text, fused, module_name, module)
        if parts is None:
            continue
        out[module_name + ".weight"] = fp8_layer_views(module_name, module, parts)
        out[module_name + ".weight_scale_inv"] = {}
        out[module_name + ".tail_weight"] = {}
    return out
