"""cuBLAS on a prompt's projections at Qwen3.8-27B shapes (M = 4096 rows, bf16).

Each projection as the model runs it (`F.linear`, the weight [N, K]) beside the same product with
the weight padded by zero rows to a multiple of 128 and of 256 output columns (what a padded fused
parameter would run; the extra columns cost their FLOPs, counted as the unpadded product's),
replayed from CUDA graphs (`time_graph`: device time, without the host's launch), as a fraction
of this run's matmul peak.

Then, on CUDA, the first `NUM_CANDIDATES` algorithms cuBLASLt's heuristic offers for the shape
(`F.linear` runs its first), each timed as a burst (`time_graph`) and at the power cap
(`time_at_power_cap`: after 0.4 s of the same calls), with F.linear at the cap beside them. A
prompt's forward runs at the cap, so that column says what a choice of algorithm would gain.
Run alone: ``python -m sparkinfer.lab.kernels.prefill_linear``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.bench import roofline
from sparkinfer.bench.timing import Timing, time_at_power_cap
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import time_graph
from sparkinfer.lab.kernels.linear_invariant import PREFILL_ROWS, SHAPES, prefill_row

PAD_MULTIPLES = (128, 256)
NUM_CANDIDATES = 8

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
        capped = time_at_power_cap(device, lambda a=x, w=w: F.linear(a, w))
        rows.append(prefill_row("cublas, at the power cap", shape, capped, capped, peak))
        if device.type == "cuda":
            rows += _candidate_rows(x, w, times["cublas"], capped, peak, warmup, iters, is_quick)
        del x, w, weights
        torch.cuda.empty_cache()
    return rows


def _candidate_rows(
    x: torch.Tensor, w: torch.Tensor, burst: Timing, capped: Timing, peak: float,
    warmup: int, iters: int, is_quick: bool,
) -> list[Row]:  # fmt: skip
    """cuBLASLt's candidates for x @ w.T: each as a burst and at the power cap, against F.linear
    timed the same way, and whether its output equals F.linear's bit for bit."""
    from sparkinfer.lab.kernels._cublaslt import WORKSPACE_BYTES, LtMatmul

    (m, k), n = x.shape, w.shape[0]
    plan = LtMatmul(m, n, k, x.dtype)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=x.device)
    expected = F.linear(x, w)
    rows = []
    for i, algo in enumerate(plan.algos(2 if is_quick else NUM_CANDIDATES)):
        call = lambda a=algo: plan(x, w, out, a, workspace)
        call()
        same = torch.equal(out, expected)
        name = f"cuBLASLt #{i} ({algo.name})"
        t_burst = time_graph([call], warmup=warmup, iters=iters)
        t_cap = time_at_power_cap(x.device, call)
        timed = ((name, t_burst, burst), (f"{name}, at the power cap", t_cap, capped))
        for label, t, base in timed:
            rows.append(prefill_row(label, (m, n, k), t, base, peak) | {"same_bits": same})
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=30).parse_args(), __doc__)


if __name__ == "__main__":
    main()
