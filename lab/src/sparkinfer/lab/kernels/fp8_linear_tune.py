"""Sweeps of the FP8 decode kernels' tiles at the 27B projections, for a person choosing the
entries of `fp8_linear.tiles` (it prints rather than returns rows): the one-row GEMV's BN, BK,
warps and K splits, and the decode GEMM's BN, BK, stages, K splits and weight conversion at each
row count, and with `--kernel swap_ab` the swap-AB GEMM's BN, stages and K splits (with `--x-fp8`
reading x quantized before the launch, as the norm before an in-projection gives it; the GEMV's
candidates include the weight converted by bit moves, BF16_BITS), each candidate
CUDA-graph timed over weights rotated out of L2 and quoted as its
fraction of this run's copy rate (the FP8 roofline: e4m3 weight bytes, scales, x and y). Per
shape and row count it prints the kernel's default tile, the table's entry and the best three
candidates; K splits are swept only for the narrow weights (`tiles.NARROW_N`), where programs
are few.
Run: ``python3 -m sparkinfer.lab.kernels.fp8_linear_tune [--rows 1,8,32] [--kernel swap_ab]
[--x-fp8]``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import torch
from sparkinfer.kernels.fp8_linear import (
    CUBLAS_ROW_MULTIPLE,
    Fp8Activation,
    Fp8DecodeConfig,
    Fp8GemvConfig,
    Fp8SwapAbConfig,
    fp8_gemm_decode,
    fp8_gemm_swap_ab,
    fp8_gemv,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.tiles import NARROW_N, decode_tile, gemv_tile, swap_ab_tile
from sparkinfer.lab.kernels._graph_timing import copy_bandwidth, rotation_copies, time_graph
from sparkinfer.lab.kernels.fp8_linear import SHAPES

GEMV_CANDIDATES = [
    Fp8GemvConfig(BN=bn, BK=bk, num_warps=w, BF16_BITS=bits)
    for bn, bk, w, bits in itertools.product((8, 16, 32), (256, 512), (4, 8), (False, True))
]
GEMV_CANDIDATES += [  # deeper pipelines: more weight bytes in flight per SM
    Fp8GemvConfig(BN=bn, BK=256, num_warps=4, num_stages=st, BF16_BITS=True)
    for bn, st in itertools.product((16, 32), (4, 5))
]
GEMV_SPLIT_CANDIDATES = [
    Fp8GemvConfig(BN=bn, BK=256, SPLIT_K=sk, num_warps=4, BF16_BITS=bits)
    for bn, sk, bits in itertools.product((16, 32), (2, 4, 8), (False, True))
]
DECODE_CANDIDATES = [
    Fp8DecodeConfig(BN=bn, BK=bk, num_warps=4, num_stages=st)
    for bn, bk, st in itertools.product((16, 32, 64), (64, 128), (3, 5))
]
DECODE_CANDIDATES += [  # the weight converted by bit moves instead of through fp16
    Fp8DecodeConfig(BN=bn, BK=128, num_warps=4, num_stages=st, BF16_BITS=True)
    for bn, st in itertools.product((32, 64), (4, 5))
]
DECODE_SPLIT_CANDIDATES = [
    Fp8DecodeConfig(BN=bn, BK=128, num_warps=4, num_stages=st, SPLIT_K=sk, BF16_BITS=bits)
    for bn, sk, (st, bits) in itertools.product(
        (32, 64), (2, 4), ((4, False), (5, False), (5, True))
    )
]
SWAP_AB_CANDIDATES = [
    Fp8SwapAbConfig(BN=bn, num_stages=st, SPLIT_K=sk, num_warps=w)
    for bn, st, sk, w in itertools.product((64, 128), (2, 3, 4, 5), (1, 2), (4, 8))
    if w == 4 or bn == 128
]
SWAP_AB_CANDIDATES += [  # wide N at few rows: more programs (a K split) or wider tiles
    Fp8SwapAbConfig(BN=bn, num_stages=st, SPLIT_K=4, num_warps=w)
    for bn, st, w in ((64, 4, 4), (128, 4, 4), (128, 4, 8), (256, 3, 8))
]
SWAP_AB_CANDIDATES += [  # launched as a dependent, the first weight steps asked of L2 first
    Fp8SwapAbConfig(BN=64, num_stages=st, SPLIT_K=sk, DEPENDENT=True, PREFETCH=pf)
    for st, sk, pf in itertools.product((3, 4), (1, 2), (0, 2, 4))
]
SWAP_AB_CANDIDATES += [  # x quantized once before the launch: less work per program at 32-64 rows
    Fp8SwapAbConfig(BN=bn, num_stages=st, SPLIT_K=sk, PREQUANTIZE=True)
    for bn, st, sk in itertools.product((64, 128), (2, 3), (1, 2))
]
SWAP_AB_SPLIT_CANDIDATES = [
    Fp8SwapAbConfig(BN=bn, num_stages=st, SPLIT_K=sk)
    for bn, st, sk in itertools.product((64, 128), (2, 3), (4, 8, 16))
] + [
    Fp8SwapAbConfig(BN=64, num_stages=st, SPLIT_K=sk, PREQUANTIZE=True)
    for st, sk in itertools.product((2, 3), (4, 8, 16))
]


def _fraction(m: int, n: int, k: int, ms: float, copy: float) -> float:
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128)) + 2 * m * (k + n)
    return nbytes / (ms / 1e3) / copy


def _with_x_fp8(x: torch.Tensor):
    """The swap-AB GEMM reading x as the norm before quantized it (`--x-fp8`)."""
    x_fp8 = Fp8Activation(*quantize_activation_fp8(x, CUBLAS_ROW_MULTIPLE))
    return lambda x, w, s, cfg: fp8_gemm_swap_ab(x, w, s, cfg, x_fp8=x_fp8)


def _time(fn, x, weights, cfg, warmup: int, iters: int) -> float:
    calls = [lambda w=w, s=s: fn(x, w, s, cfg) for w, s in weights]
    return time_graph(calls, warmup=warmup, iters=iters).median_ms


def _candidates(m: int, n: int, k: int, kernel: str) -> tuple[Any, Any, Any, list[Any]]:
    """(kernel, its default tile, the table's entry, the candidates) at M rows of [N, K]."""
    is_narrow = n <= NARROW_N
    if kernel == "swap_ab":
        extra = SWAP_AB_SPLIT_CANDIDATES if is_narrow else []
        entry = swap_ab_tile(m, n, k)
        return fp8_gemm_swap_ab, Fp8SwapAbConfig(), entry, SWAP_AB_CANDIDATES + extra
    if m == 1:
        extra = GEMV_SPLIT_CANDIDATES if is_narrow else []
        return fp8_gemv, Fp8GemvConfig(), gemv_tile(n, k), GEMV_CANDIDATES + extra
    extra = DECODE_SPLIT_CANDIDATES if is_narrow else []
    return fp8_gemm_decode, Fp8DecodeConfig(), decode_tile(m, n, k), DECODE_CANDIDATES + extra


def _line(label: str, ms: float | None, frac: float | None, cfg) -> str:
    if ms is None:
        return f"    {label:8s} failed: {cfg}"
    return f"    {label:8s} {ms * 1e3:8.1f} us  {frac:.3f}  {cfg}"


def _sweep_one(m: int, n: int, k: int, weights, copy: float, args: argparse.Namespace) -> None:
    device = weights[0][0].device
    warmup, iters = args.warmup, args.iters
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    fn, default, entry, candidates = _candidates(m, n, k, args.kernel)
    if args.kernel == "swap_ab" and args.x_fp8:
        fn = _with_x_fp8(x)
    w0, s0 = weights[0]
    ref = fp8_linear_prompt_ref if args.kernel == "swap_ab" else fp8_linear_ref
    err = (fn(x, w0, s0, entry).float() - ref(x, w0, s0).float()).abs().max().item()
    timed: dict = {}
    for cfg in dict.fromkeys([default, entry, *candidates]):
        try:
            timed[cfg] = _time(fn, x, weights, cfg, warmup, iters)
        except Exception as e:  # a tile that does not compile or fit: say so, go on
            print(f"    {cfg}: {type(e).__name__}: {str(e)[:80]}")
    best = sorted(timed.items(), key=lambda p: p[1])[:3]

    def row(label: str, cfg) -> str:
        ms = timed.get(cfg)
        return _line(label, ms, None if ms is None else _fraction(m, n, k, ms, copy), cfg)

    print(f"  M={m}: table entry max_abs_err vs reference {err:.2e}")
    print(row("default", default))
    print(row("table", entry))
    for i, (cfg, _) in enumerate(best):
        print(row(f"best {i + 1}", cfg))


def sweep(rows: tuple[int, ...], args: argparse.Namespace) -> None:
    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    start = time.perf_counter()
    print(f"copy rate {copy / 1e9:,.0f} GB/s")
    for op, n, k in SHAPES:
        print(f"{op} N={n} K={k}  ({time.perf_counter() - start:.0f} s)")
        try:
            w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
            weights = [quantize_weight_fp8(w16) for _ in range(rotation_copies(n * k))]
            del w16
        except Exception as e:
            print(f"  weights: {type(e).__name__}: {str(e)[:80]}")
            continue
        for m in rows:
            try:
                _sweep_one(m, n, k, weights, copy, args)
            except Exception as e:  # one row's failure must not end the sweep
                print(f"  M={m}: {type(e).__name__}: {str(e)[:120]}")
        del weights
        torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - start:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,8,32", help="comma-separated row counts")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument(
        "--kernel",
        choices=("ours", "swap_ab"),
        default="ours",
        help="ours: the GEMV at one row, the decode GEMM beyond; swap_ab: the swap-AB GEMM",
    )
    p.add_argument(
        "--x-fp8",
        action="store_true",
        help="swap_ab: x quantized before the launch, as the norm before an in-projection gives it",
    )
    args = p.parse_args()
    sweep(tuple(int(r) for r in args.rows.split(",")), args)


if __name__ == "__main__":
    main()
