"""Where batch invariance costs, kernel by kernel, at Qwen3.8-27B decode shapes on one GPU.

GEMMs at 1/8/32/64 rows: the default dispatch (`linear` outside a phase: GEMV, table tile or
cuBLAS), the invariant decode GEMM as it is, and as it was before it kept one K plan per weight
(the one-row tile at every row range). Decode attention at a 4K context: the default split plan
against the invariant one and two longer minimum splits (plans from the length alone too).
Times are `triton.testing.do_bench` medians with its L2 flush, microseconds.

Run from the repository root with the packages' sources on PYTHONPATH:
`python3 packages/bench/scripts/batch_invariance_kernels.py`.
"""

from __future__ import annotations

import dataclasses
import traceback

import torch
import triton
from sparkinfer.kernels.linear import (
    batch_invariant,
    invariant,
    invariant_linear,
    linear,
    shape_table,
    skinny_gemm,
)
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig
from sparkinfer.kernels.paged_attention import paged_attention_decode
from sparkinfer.kernels.paged_attention.decode import DecodeConfig, launch_decode

SHAPES = [(34816, 5120), (5120, 17408), (16480, 5120), (14336, 5120), (5120, 6144),
          (6144, 5120), (12288, 5120), (10240, 5120), (1024, 5120), (248320, 5120)]  # fmt: skip
ROWS = (1, 8, 32, 64)
BATCHES = (1, 8, 32, 64)
CONTEXT, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4096, 24, 4, 256, 64


def bench_us(fn) -> float:
    ms = triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")
    return float(ms) * 1e3  # type: ignore[arg-type]


def old_invariant_config(n: int, k: int, rows: int) -> SkinnyGemmConfig:
    """The invariant decode tile before the per-weight K plan: the one-row tile in every range."""
    measured = shape_table.decode_entry(n, k, torch.bfloat16)
    if measured is None:
        bn = next((b for b in (64, 32) if triton.cdiv(n, b) >= 192), 16)
        measured = SkinnyGemmConfig(BN=bn, BK=128, SPLIT_K=1, num_stages=4)
    return dataclasses.replace(measured, BM=invariant.decode_tile_rows(rows, torch.bfloat16))


def gemm_times(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float, float]:
    """(default, old invariant, invariant) microseconds for x @ w.T."""
    old = old_invariant_config(w.shape[0], w.shape[1], x.shape[0])
    return (
        bench_us(lambda: linear(x, w)),
        bench_us(lambda: skinny_gemm(x, w, old)),
        bench_us(lambda: invariant_linear(x, w, "decode")),
    )


def gemm_rows() -> None:
    print("| weight N x K | rows | default us | old invariant us | invariant us | cost |")
    print("|---|---|---|---|---|---|")
    totals: dict[int, list[float]] = {m: [0.0, 0.0, 0.0] for m in ROWS}
    for n, k in SHAPES:
        try:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for m in ROWS:
                t = gemm_times(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), w)
                totals[m] = [a + b for a, b in zip(totals[m], t, strict=True)]
                print(f"| {n} x {k} | {m} | {t[0]:.1f} | {t[1]:.1f} | {t[2]:.1f} | "
                      f"{(t[2] / t[0] - 1) * 100:+.1f}% |", flush=True)  # fmt: skip
        except Exception as e:  # a shape's failure is printed, the others still run
            traceback.print_exc()
            print(f"| {n} x {k} | - | error: {e} | | | |")
    for m, (a, b, c) in totals.items():
        if a > 0:
            print(f"| sum of the shapes | {m} | {a:.1f} | {b:.1f} | {c:.1f} | "
                  f"{(c / a - 1) * 100:+.1f}% |")  # fmt: skip


def attention_times(b: int) -> list[float]:
    """Decode attention microseconds for `b` sequences of CONTEXT keys: the default plan, the
    invariant one, then fixed plans with longer minimum splits."""
    blocks = b * (CONTEXT // BLOCK)
    shape = (blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(b, -1)
    lens = torch.full((b,), CONTEXT, device="cuda", dtype=torch.int32)
    q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn_like(q)
    scale = HEAD_DIM**-0.5

    def default_call() -> torch.Tensor:
        return paged_attention_decode(q, k_cache, v_cache, context_lens=lens,
                                      block_tables=tables, scale=scale, gate=gate)  # fmt: skip

    def invariant_call() -> torch.Tensor:
        with batch_invariant("decode"):
            return default_call()

    times = [bench_us(default_call), bench_us(invariant_call)]
    for split in (512, 1024):
        config = DecodeConfig(MIN_SPLIT_LEN=split, use_tma=True)
        times.append(bench_us(
            lambda c=config: launch_decode(q, k_cache, v_cache, lens, tables, scale, gate, c)
        ))  # fmt: skip
    return times


def attention_rows() -> None:
    print("\n| decode attention, 4K context | default us | invariant (256) us | 512 us | 1024 us |")
    print("|---|---|---|---|---|")
    for b in BATCHES:
        try:
            times = attention_times(b)
            print(f"| {b} streams | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)
        except Exception as e:
            traceback.print_exc()
            print(f"| {b} streams | error: {e} | | | |")


def main() -> None:
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    gemm_rows()
    attention_rows()


if __name__ == "__main__":
    main()
