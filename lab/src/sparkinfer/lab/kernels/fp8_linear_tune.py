"""Sweeps of the FP8 decode kernels' tiles at the 27B projections, for a person choosing the
defaults (it prints rather than returns rows): the one-row GEMV's BN, BK and warps, and the
decode GEMM's BN, BK, warps and stages at 8, 32 and 64 rows, each candidate CUDA-graph timed over
weights rotated out of L2 and quoted as its fraction of this run's copy rate (the FP8 roofline:
e4m3 weight bytes, scales, x and y). Run: ``python -m sparkinfer.lab.kernels.fp8_linear_tune``.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from sparkinfer.kernels.fp8_linear import (
    Fp8DecodeConfig,
    Fp8GemvConfig,
    fp8_gemm_decode,
    fp8_gemv,
    quantize_weight_fp8,
)
from sparkinfer.lab.kernels._graph_timing import copy_bandwidth, rotation_copies, time_graph
from sparkinfer.lab.kernels.fp8_linear import SHAPES

GEMV_CANDIDATES = [
    Fp8GemvConfig(BN=bn, BK=bk, num_warps=w, num_stages=st)
    for bn, bk, w, st in itertools.product((4, 8, 16), (256, 512), (4, 8), (3,))
]
DECODE_CANDIDATES = [
    Fp8DecodeConfig(BN=bn, BK=bk, num_warps=w, num_stages=st)
    for bn, bk, w, st in itertools.product((16, 32, 64), (64, 128), (4,), (3, 5))
]


def _fraction(m: int, n: int, k: int, ms: float, copy: float) -> float:
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128)) + 2 * m * (k + n)
    return nbytes / (ms / 1e3) / copy


def _time(fn, x, weights, cfg, warmup: int, iters: int) -> float:
    calls = [lambda w=w, s=s: fn(x, w, s, cfg) for w, s in weights]
    return time_graph(calls, warmup=warmup, iters=iters).median_ms


def sweep(rows: tuple[int, ...], *, warmup: int, iters: int) -> None:
    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    print(f"copy rate {copy / 1e9:,.0f} GB/s")
    for op, n, k in SHAPES:
        w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        weights = [quantize_weight_fp8(w16) for _ in range(rotation_copies(n * k))]
        del w16
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            fn, candidates = (fp8_gemv, GEMV_CANDIDATES) if m == 1 else (
                fp8_gemm_decode, DECODE_CANDIDATES)  # fmt: skip
            timed = []
            for cfg in candidates:
                try:
                    timed.append((_time(fn, x, weights, cfg, warmup, iters), cfg))
                except Exception as e:  # a tile that does not compile or fit: skip it
                    print(f"  {op} M={m} {cfg}: {type(e).__name__}: {str(e)[:80]}")
            timed.sort(key=lambda p: p[0])
            default = Fp8GemvConfig() if m == 1 else Fp8DecodeConfig()
            td = _time(fn, x, weights, default, warmup, iters)
            print(f"{op} M={m} N={n} K={k}: default {td * 1e3:.1f} us "
                  f"({_fraction(m, n, k, td, copy):.3f})")  # fmt: skip
            for ms, cfg in timed[:3]:
                print(f"    {ms * 1e3:8.1f} us  {_fraction(m, n, k, ms, copy):.3f}  {cfg}")
        del weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,8,32", help="comma-separated row counts")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    sweep(tuple(int(r) for r in args.rows.split(",")), warmup=args.warmup, iters=args.iters)


if __name__ == "__main__":
    main()
