"""cuBLAS on a prompt's projections at Qwen3.8-27B shapes (M = 4096 rows, bf16).

Each projection as the model runs it (`F.linear`, the weight [N, K]) beside the same product with
the weight padded by zero rows to a multiple of 128 and of 256 output columns (what a padded fused
parameter would run; the extra columns cost their FLOPs, counted as the unpadded product's),
replayed from CUDA graphs (`time_graph`: device time, without the host's launch), as a fraction
of this run's matmul peak. Run alone:
``python -m sparkinfer.bench.kernels.prefill_linear``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.bench import roofline
from sparkinfer.bench.kernels import KernelBenchArgs
from sparkinfer.bench.kernels._cli import run_alone, standalone_parser
from sparkinfer.bench.kernels._graph_timing import time_graph
from sparkinfer.bench.kernels.linear_invariant import PREFILL_ROWS, SHAPES, prefill_row

PAD_MULTIPLES = (128, 256)

Row = dict[str, Any]


def _padded(w: torch.Tensor, multiple: int) -> torch.Tensor:
    rows = -(-w.shape[0] // multiple) * multiple
    return torch.cat([w, w.new_zeros(rows - w.shape[0], w.shape[1])])


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    peak = roofline.measure_peaks(device).matmul_flop_s
    rows = []
    shapes = [s for s in SHAPES if s[0] < 100_000]  # the lm_head runs on one row of a prompt
    for n, k in shapes[:1] if is_quick else shapes:
        x = torch.randn(PREFILL_ROWS, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        weights = {"cublas": w}
        for multiple in PAD_MULTIPLES:
            if n % multiple:
                weights[f"cublas, N padded to {multiple}s"] = _padded(w, multiple)
        times = {
            name: time_graph([lambda a=x, w=w: F.linear(a, w)], warmup=warmup, iters=iters)
            for name, w in weights.items()
        }
        shape = (PREFILL_ROWS, n, k)
        rows += [prefill_row(name, shape, t, times["cublas"], peak) for name, t in times.items()]
        del x, w, weights
        torch.cuda.empty_cache()
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-bench kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=30).parse_args(), __doc__)


if __name__ == "__main__":
    main()
