"""The kernel benchmarks, in one table: op → the module that builds its inputs and times it →
what it feeds the op and at which shapes (Qwen3.8-27B widths, bf16).

`sparkinfer-lab kernels` runs every entry (`--only` picks some); each module defines
`run(args) -> list[dict]` (protocol in `kernels/__init__.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelOp:
    """One benchmarked op: `module` under sparkinfer.lab.kernels, its `inputs` and `shapes`."""

    module: str
    inputs: str
    shapes: str


REGISTRY: dict[str, KernelOp] = {
    "causal_conv1d": KernelOp(
        "causal_conv1d",
        "x [T, C], weight [C, W], state pool; fast op beside the torch reference",
        "C=10240 W=4; prefill T=4K/16K/64K (one sequence), decode B=1/32/64",
    ),
    "fp8_linear": KernelOp(
        "fp8_linear",
        "x [M, K] bf16 against each projection's e4m3 weight [N, K] with 128x128 block scales: "
        "every route (GEMV, decode, swap-AB, prompt GEMM; swap-AB and cuBLAS also on x quantized "
        "by the norm before) and the invariant kernel, checked and timed beside cuBLAS's "
        "block-scaled FP8 GEMM (F.scaled_mm) and bf16; the routed one marked",
        "decode M=1/8/32/64 (of the FP8 copy roofline), prompt M=4096, the 27B projections",
    ),
    "gated_delta_rule": KernelOp(
        "gated_delta_rule",
        "q, k [T, 16, 128], v [T, 48, 128], gates, state pool; beside the reference and fla",
        "prefill T=4K/16K/64K; decode B=1/32/64, with the gated norm at B=1/4/8/32",
    ),
    "gdn_verify": KernelOp(
        "gdn_verify",
        "one GDN layer's speculative verify (conv + recurrent, 4 positions, 1 draft kept): the "
        "decode kernels per position with roll-back copies against the verify and commit kernels",
        "HV=48 K=V=128 C=10240; B=1/8/12/32, graph replays, per layer and x48",
    ),
    "linear": KernelOp(
        "linear",
        "x [M, K] against each decode projection's weight [N, K]; the dispatcher beside cuBLAS",
        "M=1/8/32 over the 27B projections (K=5120 or 17408)",
    ),
    "linear_invariant": KernelOp(
        "linear_invariant",
        "the batch-invariant kernels on the same weights, beside the dispatcher and cuBLAS",
        "decode M=1/8/32; prefill M=4096",
    ),
    "paged_attention": KernelOp(
        "paged_attention",
        "q [T, 24, 256] over a paged K/V cache (4 KV heads, blocks of 64); beside SDPA and a copy",
        "prefill T=4K-32K and few-row chunks over 32K prefixes; decode B=1/8/32 at 4K-128K",
    ),
    "prefill_linear": KernelOp(
        "prefill_linear",
        "a prompt's projections through F.linear, padded widths and cuBLASLt's candidates",
        "M=4096 over the 27B projections",
    ),
    "qk_norm_rotary": KernelOp(
        "qk_norm_rotary",
        "q, k, v of one attention layer and its KV cache; fused beside the three unfused kernels",
        "T=1/32/4096, 24 query and 4 KV heads, D=256, rotary on 64 dims",
    ),
    "rms_norm": KernelOp(
        "rms_norm",
        "x and residual [rows, 5120]; the GDN output [rows, 48, 128] with its gate; beside torch",
        "rows=1/32/4096",
    ),
}
