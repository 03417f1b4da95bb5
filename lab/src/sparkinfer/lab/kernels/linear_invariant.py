"""Batch-invariant linear layers: their cost against the fastest kernel per shape and cuBLAS.

Decode rows (M = 1/8/32): the fixed-config skinny GEMM (`invariant_linear(..., "decode")`), the
table-dispatched `linear` and cuBLAS, as fractions of this run's copy bandwidth. Prefill rows
(M = 4096): the fixed-tile GEMM against cuBLAS in TFLOP/s, with a sweep of candidate tiles so the
one fixed tile can be chosen from measurements (`--sweep`). Each row also checks that results are
bit-identical when the same rows run inside a larger batch. Run alone:
``python -m sparkinfer.lab.kernels.linear_invariant [--quick] [--sweep]``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
from sparkinfer.bench import roofline
from sparkinfer.bench.timing import Timing, time_cuda
from sparkinfer.kernels.linear import (
    TiledGemmConfig,
    batch_invariant,
    decode_config,
    invariant_linear,
    linear,
    skinny_gemm,
    tiled_gemm,
)
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import copy_bandwidth, rotation_copies, time_graph
from sparkinfer.lab.kernels.linear import HIDDEN, INTERMEDIATE, Q_WIDTH

# (N, K) of Qwen3.8-27B's fused projections, its output projections and the lm_head.
SHAPES: tuple[tuple[int, int], ...] = (
    (16480, HIDDEN),  # GDN in_proj: qkv + z + b + a
    (14336, HIDDEN),  # attention q (with gate) + k + v
    (2 * INTERMEDIATE, HIDDEN),  # gate_proj + up_proj
    (HIDDEN, INTERMEDIATE),  # down_proj
    (HIDDEN, Q_WIDTH),  # o_proj, GDN out_proj
    (248320, HIDDEN),  # lm_head
)
DECODE_BATCHES: tuple[int, ...] = (1, 8, 32)
PREFILL_ROWS = 4096
SWEEP = tuple(
    TiledGemmConfig(BM=bm, BN=bn, BK=bk, num_warps=w, num_stages=s, TMA=tma)
    for tma in (False, True)
    for bm, bn, bk, w, s in ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
                             (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3),
                             (64, 256, 64, 4, 4))
)  # fmt: skip

Row = dict[str, Any]


def _cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, w.t())


def _is_row_invariant(fn, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Rows of fn over a slice equal the same rows of fn over the whole batch, bit for bit."""
    full = fn(x, w)
    return all(torch.equal(fn(x[a:b], w), full[a:b]) for a, b in ((0, 1), (1, x.shape[0] // 2)))


def _decode_rows(
    device: torch.device,
    shapes: tuple[tuple[int, int], ...],
    warmup: int,
    iters: int,
    tile_rows: tuple[int, ...] = (),
) -> list[Row]:
    """`tile_rows`: also time the invariant config with these row tiles instead of DECODE_BM."""
    copy = copy_bandwidth(device)
    rows = []
    batches = DECODE_BATCHES + ((64,) if tile_rows else ())
    for (n, k), m in itertools.product(shapes, batches):
        operands = [
            (torch.randn(m, k, device=device, dtype=torch.bfloat16),
             torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
            for _ in range(rotation_copies(2 * n * k))
        ]  # fmt: skip
        nbytes = 2 * (n * k + m * k + m * n)
        impls = {
            "invariant": lambda x, w: invariant_linear(x, w, "decode"),
            "fast": linear,
            "cublas": _cublas,
        }
        for bm in tile_rows:
            config = dataclasses.replace(decode_config(n, k), BM=bm)
            impls[f"invariant BM={bm}"] = lambda x, w, c=config: skinny_gemm(x, w, c)
        times = {
            name: time_graph([lambda x=x, w=w, f=f: f(x, w) for x, w in operands],
                             warmup=warmup, iters=iters)
            for name, f in impls.items()
        }  # fmt: skip
        w = operands[0][1]
        wide = torch.randn(max(m, 33), k, device=device, dtype=torch.bfloat16)
        invariant = {
            name: _is_row_invariant(f, wide, w)
            for name, f in impls.items()
            if name.startswith("invariant")
        }
        for name, t in times.items():
            rows.append({
                "op": "decode linear", "impl": name, "shape": f"M={m} N={n} K={k}",
                "dtype": "bf16", "median_ms": t.median_ms, "p90_ms": t.p90_ms,
                "of_copy_bw": nbytes / (t.median_ms / 1e3) / copy,
                "vs_fast": times["fast"].median_ms / t.median_ms,
                "rows_invariant": invariant.get(name),
            })  # fmt: skip
        del operands
    return rows


def _prefill_rows(
    device: torch.device, shapes, configs, warmup: int, iters: int, matmul_peak: float
) -> list[Row]:
    rows = []
    for n, k in shapes:
        x = torch.randn(PREFILL_ROWS, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        impls: dict[str, Any] = {"cublas": _cublas}
        for cfg in configs:
            name = f"tiled {cfg.BM}x{cfg.BN}x{cfg.BK} w{cfg.num_warps} s{cfg.num_stages}"
            name += " tma" if cfg.TMA else ""
            impls[name] = lambda a, b, c=cfg: tiled_gemm(a, b, c)
        with batch_invariant("prefill"):
            impls["invariant"] = linear  # the tile the engine uses
            times = {}
            for name, f in impls.items():
                try:
                    call = lambda f=f, a=x, b=w: f(a, b)
                    times[name] = time_cuda(call, warmup=warmup, iters=iters)
                except Exception as e:  # a tile that does not fit this GPU is skipped
                    print(f"skip {name}: {type(e).__name__}", flush=True)
            invariant = _is_row_invariant(lambda a, b: linear(a, b), x[:1000], w)
        for name, t in times.items():
            row = prefill_row(name, (PREFILL_ROWS, n, k), t, times["cublas"], matmul_peak)
            rows.append(row | {"rows_invariant": invariant if name == "invariant" else None})
    return rows


def prefill_row(
    impl: str, shape: tuple[int, int, int], t: Timing, cublas: Timing, matmul_peak: float
) -> Row:
    """One table row of an (m, n, k) product: TFLOP/s, the share of the matmul peak (FLOP/s) and
    the speed against cuBLAS's time."""
    m, n, k = shape
    flops = 2 * m * n * k
    return {
        "op": "prefill linear", "impl": impl, "shape": f"M={m} N={n} K={k}",
        "dtype": "bf16", "median_ms": t.median_ms, "p90_ms": t.p90_ms,
        "TFLOP/s": flops / (t.median_ms / 1e3) / 1e12,
        "of_matmul_peak": flops / (t.median_ms / 1e3) / matmul_peak,
        "vs_cublas": cublas.median_ms / t.median_ms,
    }  # fmt: skip


def bench(
    device: torch.device,
    *,
    warmup: int,
    iters: int,
    is_quick: bool,
    sweep: bool,
    tile_rows: tuple[int, ...] = (),
) -> list[Row]:
    shapes = SHAPES[:2] if is_quick else SHAPES
    rows = _decode_rows(device, shapes, warmup, iters, tile_rows)
    configs = SWEEP if sweep else ()
    return rows + _prefill_rows(
        device, shapes, configs, warmup, iters, roofline.measure_peaks(device).matmul_flop_s
    )


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point (no tile sweep)."""
    return bench(
        args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick, sweep=False
    )


def main() -> None:
    parser = standalone_parser(__doc__, warmup=5, iters=20)
    parser.add_argument("--sweep", action="store_true", help="also time candidate prefill tiles")
    parser.add_argument(
        "--decode-tile-rows",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=(),
        help="also time the decode config with these row tiles (e.g. 32,64), and 64 rows",
    )
    cli = parser.parse_args()
    run_alone(
        lambda a: bench(a.device, warmup=a.warmup, iters=a.iters, is_quick=a.is_quick,
                        sweep=cli.sweep, tile_rows=cli.decode_tile_rows),
        cli, __doc__,
    )  # fmt: skip


if __name__ == "__main__":
    main()
