"""A norm fused into the one-row GEMV after it, against the norm's own launch then the GEMM.

27B decode shapes: the input norm with residual before GDN's in_proj and attention's qkv_proj,
the post-attention norm before gate_up (with its SwiGLU), and GDN's gated norm before out_proj.
Both sides launch as the engine does (from a CUDA graph, dependent launch as configured), over
weights rotated out of L2; rows report the fraction of the copy rate over the weight bytes. Run
alone: ``python -m sparkinfer.bench.kernels.norm_linear [--quick]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from sparkinfer.bench.kernels import KernelBenchArgs
from sparkinfer.bench.kernels._cli import run_alone, standalone_parser
from sparkinfer.bench.kernels._graph_timing import (
    bandwidth_row,
    copy_bandwidth,
    rotation_copies,
    time_graph,
)
from sparkinfer.kernels.linear import gated_rms_norm_linear, linear, linear_swiglu, rms_norm_linear
from sparkinfer.kernels.rms_norm import gated_rms_norm, rms_norm

HIDDEN, V_HEADS, V_DIM, EPS = 5120, 48, 128, 1e-6
ROW_SHAPES = {"in_proj": (16480, False), "qkv_proj": (14336, False), "gate_up": (34816, True)}
NUM_ROWS = (1,)  # the norms fuse for one row only

Row = dict[str, Any]


def _row_norm_calls(
    n: int, swiglu: bool, num_rows: int, device: torch.device
) -> dict[str, list[Callable[[], object]]]:
    dt = torch.bfloat16
    nw = torch.randn(HIDDEN, device=device, dtype=dt) * 0.1
    ws = [torch.randn(n, HIDDEN, device=device, dtype=dt) * 0.02
          for _ in range(rotation_copies(n * HIDDEN * 2))]  # fmt: skip
    x, res = torch.randn(2, num_rows, HIDDEN, device=device, dtype=dt).unbind(0)

    def apart(w: torch.Tensor) -> object:
        h, _ = rms_norm(x, nw, EPS, residual=res)
        return linear_swiglu(h, w) if swiglu else linear(h, w)

    def fused(w: torch.Tensor) -> object:
        return rms_norm_linear(x, nw, EPS, w, residual=res, swiglu=swiglu)

    return {
        "apart": [lambda w=w: apart(w) for w in ws],
        "fast": [lambda w=w: fused(w) for w in ws],
    }


def _gated_norm_calls(num_rows: int, device: torch.device) -> dict[str, list[Callable[[], object]]]:
    dt = torch.bfloat16
    k = V_HEADS * V_DIM
    nw = torch.randn(V_DIM, device=device, dtype=dt)
    ws = [torch.randn(HIDDEN, k, device=device, dtype=dt) * 0.02
          for _ in range(rotation_copies(HIDDEN * k * 2))]  # fmt: skip
    x = torch.randn(num_rows, V_HEADS, V_DIM, device=device, dtype=dt)
    z = torch.randn(num_rows, 16480, device=device, dtype=dt)[:, 10240 : 10240 + k]
    z = z.view(num_rows, V_HEADS, V_DIM)

    def apart(w: torch.Tensor) -> object:
        return linear(gated_rms_norm(x, z, nw, EPS).view(num_rows, k), w)

    return {
        "apart": [lambda w=w: apart(w) for w in ws],
        "fast": [lambda w=w: gated_rms_norm_linear(x, z, nw, EPS, w) for w in ws],
    }


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    copy = copy_bandwidth(device)
    rows: list[Row] = []
    for num_rows in NUM_ROWS:
        cases = {
            name: (n * HIDDEN * 2, _row_norm_calls(n, swiglu, num_rows, device))
            for name, (n, swiglu) in ROW_SHAPES.items()
        }
        cases["out_proj"] = (HIDDEN * V_HEADS * V_DIM * 2, _gated_norm_calls(num_rows, device))
        for name, (nbytes, calls) in cases.items():
            times = {impl: time_graph(c, warmup=warmup, iters=iters) for impl, c in calls.items()}
            saved_us = (times["apart"].median_ms - times["fast"].median_ms) * 1e3
            for impl, t in times.items():
                extra = {"saved_us": saved_us} if impl == "fast" else None
                shape = f"{name} M={num_rows}"
                row = bandwidth_row("norm+linear", impl, shape, t, nbytes=nbytes, copy=copy)
                rows.append(row | (extra or {}))
            del calls
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-bench kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=50).parse_args(), __doc__)


if __name__ == "__main__":
    main()
