"""Model layers and the table of kernel entry points they call.

`KernelOps` is chosen once per model from its device: the fast Triton launchers on CUDA, the
plain-torch references on CPU. Both sides share their signatures (docs/contracts.md), so a layer
calls `self.ops.<op>(...)` without knowing which one it got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkinfer.kernels.activation import silu_and_mul_ref
from sparkinfer.kernels.causal_conv1d import (
    causal_conv1d_commit_ref,
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    causal_conv1d_verify_ref,
)
from sparkinfer.kernels.fp8_linear import fp8_linear_ref
from sparkinfer.kernels.gated_delta_rule import (
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule_commit_ref,
    fused_recurrent_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule_verify_ref,
    gdn_gating_ref,
)
from sparkinfer.kernels.paged_attention import (
    paged_attention_block_ref,
    paged_attention_decode_ref,
    paged_attention_prefill_ref,
)
from sparkinfer.kernels.qk_norm_rotary import qk_norm_rotary_ref
from sparkinfer.kernels.rms_norm import (
    gated_rms_norm_ref,
    rms_norm_quantize_fp8_ref,
    rms_norm_ref,
)

Op = Callable[..., Any]


@dataclass(frozen=True)
class KernelOps:
    """The kernel functions one model calls; `linear` is None where torch's GEMM is used, and
    `linear_swiglu` (gate_up_proj and SwiGLU in one call) None where the MLP runs them apart;
    `fp8_linear` multiplies by a block-scaled e4m3 weight (`Linear.use_fp8`), and
    `rms_norm_quantize_fp8` is the norm that also quantizes its output for such a linear."""

    rms_norm: Op
    gated_rms_norm: Op
    qk_norm_rotary: Op
    paged_attention_prefill: Op
    paged_attention_decode: Op
    causal_conv1d: Op
    causal_conv1d_update: Op
    gdn_gating: Op
    chunk_gated_delta_rule: Op
    fused_recurrent_gated_delta_rule: Op
    silu_and_mul: Op
    linear: Op | None
    linear_swiglu: Op | None
    is_triton: bool
    fp8_linear: Op = fp8_linear_ref
    rms_norm_quantize_fp8: Op = rms_norm_quantize_fp8_ref
    # A speculative verify's GDN kernels: every position in one launch, the state left, then the
    # accepted positions committed.
    causal_conv1d_verify: Op = causal_conv1d_verify_ref
    causal_conv1d_commit: Op = causal_conv1d_commit_ref
    fused_recurrent_gated_delta_rule_verify: Op = fused_recurrent_gated_delta_rule_verify_ref
    fused_recurrent_gated_delta_rule_commit: Op = fused_recurrent_gated_delta_rule_commit_ref
    # A block drafter's rows over its pages, each in its own key range (a window, a causal block).
    paged_attention_block: Op = paged_attention_block_ref


REFERENCE_OPS = KernelOps(
    rms_norm=rms_norm_ref,
    gated_rms_norm=gated_rms_norm_ref,
    qk_norm_rotary=qk_norm_rotary_ref,
    paged_attention_prefill=paged_attention_prefill_ref,
    paged_attention_decode=paged_attention_decode_ref,
    causal_conv1d=causal_conv1d_ref,
    causal_conv1d_update=causal_conv1d_update_ref,
    gdn_gating=gdn_gating_ref,
    chunk_gated_delta_rule=chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule_ref,
    silu_and_mul=silu_and_mul_ref,
    linear=None,
    linear_swiglu=None,
    is_triton=False,
)


def triton_ops() -> KernelOps:
    """The fast launchers (imported here so CPU-only installs never load Triton)."""
    from sparkinfer.kernels.activation import silu_and_mul
    from sparkinfer.kernels.causal_conv1d import (
        causal_conv1d,
        causal_conv1d_commit,
        causal_conv1d_update,
        causal_conv1d_verify,
    )
    from sparkinfer.kernels.fp8_linear import fp8_linear
    from sparkinfer.kernels.gated_delta_rule import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
        fused_recurrent_gated_delta_rule_commit,
        fused_recurrent_gated_delta_rule_verify,
        gdn_gating,
    )
    from sparkinfer.kernels.linear import linear, linear_swiglu
    from sparkinfer.kernels.paged_attention import (
        paged_attention_block,
        paged_attention_decode,
        paged_attention_prefill,
    )
    from sparkinfer.kernels.qk_norm_rotary import qk_norm_rotary
    from sparkinfer.kernels.rms_norm import gated_rms_norm, rms_norm, rms_norm_quantize_fp8

    return KernelOps(
        rms_norm=rms_norm,
        gated_rms_norm=gated_rms_norm,
        qk_norm_rotary=qk_norm_rotary,
        paged_attention_prefill=paged_attention_prefill,
        paged_attention_decode=paged_attention_decode,
        causal_conv1d=causal_conv1d,
        causal_conv1d_update=causal_conv1d_update,
        gdn_gating=gdn_gating,
        chunk_gated_delta_rule=chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
        silu_and_mul=silu_and_mul,
        linear=linear,
        linear_swiglu=linear_swiglu,
        is_triton=True,
        fp8_linear=fp8_linear,
        rms_norm_quantize_fp8=rms_norm_quantize_fp8,
        causal_conv1d_verify=causal_conv1d_verify,
        causal_conv1d_commit=causal_conv1d_commit,
        fused_recurrent_gated_delta_rule_verify=fused_recurrent_gated_delta_rule_verify,
        fused_recurrent_gated_delta_rule_commit=fused_recurrent_gated_delta_rule_commit,
        paged_attention_block=paged_attention_block,
    )


def select_ops(*, use_triton: bool) -> KernelOps:
    """Fast kernels for a CUDA model, references for a CPU model."""
    return triton_ops() if use_triton else REFERENCE_OPS


def new_parameter(*shape: int, device: Any, dtype: Any) -> Any:
    """An uninitialised, inference-only parameter (weights.py or embedded.py fills it)."""
    import torch

    return torch.nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)
