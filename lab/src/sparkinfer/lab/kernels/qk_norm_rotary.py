"""Fused q/k norm + rotary + KV-cache write against the three kernels it replaces, at 27B shapes.

One attention layer's tokens (24 query heads, 4 KV heads, D=256, rotary on 64 dims, bf16, KV cache
blocks of 64): the fused kernel beside `rms_norm` on q and k, `apply_rotary` and `write_kv_cache`
run back to back (the unfused Triton path), timed as CUDA-graph replays over inputs rotated out of
L2. Memory-bound: rows report the fraction of this run's copy bandwidth over the bytes the fused
kernel must move (q, k and v read; q, k and v written). Run alone:
``python -m sparkinfer.lab.kernels.qk_norm_rotary [--quick]``.
"""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import (
    bandwidth_row,
    copy_bandwidth,
    rotation_copies,
    time_graph,
)

H, HKV, D, ROTARY, BLOCK_SIZE, EPS = 24, 4, 256, 64, 64, 1e-6
NUM_TOKENS = (1, 32, 4096)

Row = dict[str, Any]


def _inputs(num_tokens: int, device: torch.device) -> dict[str, torch.Tensor]:
    """q/gate, k, v as views of one packed projection, as the attention layer makes them."""
    qkv = torch.randn(num_tokens, (2 * H + 2 * HKV) * D, device=device, dtype=torch.bfloat16)
    q_gate, k, v = qkv.split((2 * H * D, HKV * D, HKV * D), dim=-1)
    num_blocks = -(-num_tokens // BLOCK_SIZE)
    angles = torch.rand(num_tokens, ROTARY // 2, device=device) * 6.0
    return {
        "q": q_gate.view(num_tokens, H, 2 * D)[..., :D],
        "k": k.view(num_tokens, HKV, D),
        "v": v.view(num_tokens, HKV, D),
        "cos": torch.cat((angles.cos(), angles.cos()), dim=-1),
        "sin": torch.cat((angles.sin(), angles.sin()), dim=-1),
        "k_cache": torch.zeros(num_blocks, BLOCK_SIZE, HKV, D, device=device, dtype=torch.bfloat16),
        "v_cache": torch.zeros(num_blocks, BLOCK_SIZE, HKV, D, device=device, dtype=torch.bfloat16),
        "slot_mapping": torch.randperm(num_blocks * BLOCK_SIZE, device=device)[:num_tokens],
    }


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    from sparkinfer.kernels.paged_attention import write_kv_cache
    from sparkinfer.kernels.qk_norm_rotary import qk_norm_rotary
    from sparkinfer.kernels.rms_norm import rms_norm
    from sparkinfer.kernels.rotary import apply_rotary

    copy = copy_bandwidth(device)
    q_weight = torch.randn(D, device=device, dtype=torch.bfloat16) * 0.1
    k_weight = torch.randn(D, device=device, dtype=torch.bfloat16) * 0.1

    def fused(x: dict[str, torch.Tensor]) -> torch.Tensor:
        return qk_norm_rotary(
            x["q"], x["k"], x["v"], q_weight=q_weight, k_weight=k_weight, eps=EPS,
            cos=x["cos"], sin=x["sin"], k_cache=x["k_cache"], v_cache=x["v_cache"],
            slot_mapping=x["slot_mapping"],
        )  # fmt: skip

    def unfused(x: dict[str, torch.Tensor]) -> torch.Tensor:
        q, _ = rms_norm(x["q"], q_weight, EPS)
        k, _ = rms_norm(x["k"], k_weight, EPS)
        q, k = apply_rotary(q, k, x["cos"], x["sin"])
        write_kv_cache(k, x["v"], x["k_cache"], x["v_cache"], x["slot_mapping"])
        return q

    rows = []
    for num_tokens in (32,) if is_quick else NUM_TOKENS:
        nbytes = 2 * num_tokens * (H + 2 * HKV) * D * 2  # q, k, v in and out, bf16
        xs = [_inputs(num_tokens, device) for _ in range(rotation_copies(nbytes))]
        err = (fused(xs[0]).float() - unfused(xs[0]).float()).abs().max().item()
        for impl, fn in (("fast", fused), ("unfused_triton", unfused)):
            t = time_graph([lambda x=x, fn=fn: fn(x) for x in xs], warmup=warmup, iters=iters)
            shape = f"T={num_tokens} H={H} HKV={HKV} D={D} R={ROTARY}"
            extra = {"max_abs_err": err if impl == "fast" else None}
            rows.append(
                bandwidth_row(
                    "qk_norm_rotary", impl, shape, t, nbytes=nbytes, copy=copy, extra=extra
                )
            )
        del xs
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=20).parse_args(), __doc__)


if __name__ == "__main__":
    main()
