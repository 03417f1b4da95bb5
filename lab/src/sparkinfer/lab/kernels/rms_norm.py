"""RMSNorm benchmark: fused (1+w) RMSNorm with residual add and gated RMSNorm vs torch eager.

Memory-bound: rows report the fraction of this run's copy bandwidth. Run alone:
``python -m sparkinfer.lab.kernels.rms_norm [--quick]``.
"""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.kernels.rms_norm import gated_rms_norm, gated_rms_norm_ref, rms_norm, rms_norm_ref
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import (
    bandwidth_row,
    copy_bandwidth,
    rotation_copies,
    time_graph,
)

HIDDEN, V_HEADS, V_DIM, EPS = 5120, 48, 128, 1e-6
NUM_ROWS = (1, 32, 4096)

Row = dict[str, Any]


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    copy = copy_bandwidth(device)
    rows = []
    w = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16) * 0.1
    wg = torch.randn(V_DIM, device=device, dtype=torch.bfloat16)
    for num_rows in (32,) if is_quick else NUM_ROWS:
        # Residual norm reads x and residual and writes y and the new residual.
        nbytes = 4 * num_rows * HIDDEN * 2
        xs = [torch.randn(2, num_rows, HIDDEN, device=device, dtype=torch.bfloat16)
              for _ in range(rotation_copies(nbytes))]  # fmt: skip
        for impl, fn in (("fast", rms_norm), ("torch_eager", rms_norm_ref)):
            calls = [lambda x=x, fn=fn: fn(x[0], w, EPS, residual=x[1]) for x in xs]
            t = time_graph(calls, warmup=warmup, iters=iters)
            shape = f"rows={num_rows} N={HIDDEN}"
            rows.append(
                bandwidth_row("rms_norm+residual", impl, shape, t, nbytes=nbytes, copy=copy)
            )
        # Gated norm of the GDN output per value head: reads x and z, writes y.
        gated_bytes = 3 * num_rows * V_HEADS * V_DIM * 2
        xzs = [torch.randn(2, num_rows, V_HEADS, V_DIM, device=device, dtype=torch.bfloat16)
               for _ in range(rotation_copies(gated_bytes))]  # fmt: skip
        for impl, fn in (("fast", gated_rms_norm), ("torch_eager", gated_rms_norm_ref)):
            calls = [lambda xz=xz, fn=fn: fn(xz[0], xz[1], wg, EPS) for xz in xzs]
            t = time_graph(calls, warmup=warmup, iters=iters)
            shape = f"rows={num_rows} HV={V_HEADS} V={V_DIM}"
            rows.append(
                bandwidth_row("gated_rms_norm", impl, shape, t, nbytes=gated_bytes, copy=copy)
            )
        del xs, xzs
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=20).parse_args(), __doc__)


if __name__ == "__main__":
    main()
