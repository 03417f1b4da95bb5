"""Which FP8 kernel runs a batch of M rows: the one table `fp8_linear` reads.

Rows are read in order and the first route whose max_rows holds M wins; the last route holds
every M. The kernels:

- "gemv": `fp8_gemv`, one row, bf16 activation, the weight in vector loads (no tensor cores);
- "swap_ab": `fp8_gemm_swap_ab`, e4m3 tensor-core dots with the weight rows on the MMA's wide
  side, x quantized per token and group in registers;
- "decode": `fp8_gemm_decode`, bf16 activations, e4m3 tiles converted to bf16 for the dot;
- "cublas": cuBLAS's block-scaled GEMM (`F.scaled_mm`, 1x128 activation and 128x128 weight
  blocks), where `cublas.cublas_accepts` the operands, else the Triton kernel of the same rows
  ("decode" to DECODE_MAX_ROWS rows, "prompt" beyond);
- "prompt": `fp8_gemm_prompt`, e4m3 tensor-core tiles for long prompts.

The committed routes are the fastest of `sparkinfer.lab.kernels.fp8_linear`'s run on an H200 at
the 27B projections (docs/benchmarks.md, FP8 section). A caller may pass other routes in its
`tuning.KernelTuning` (`fp8_routes`). The batch-invariant mode ignores them (`dispatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Fp8Kernel = Literal["gemv", "swap_ab", "decode", "cublas", "prompt"]
DECODE_MAX_ROWS = 64  # the decode GEMM's row tiles reach 64 rows; longer batches are prompts


@dataclass(frozen=True)
class Fp8Route:
    """Run `kernel` for batches of at most max_rows rows (None: any)."""

    kernel: Fp8Kernel
    max_rows: int | None = None


# Measured at the 27B projections on an H200 (1, 8, 16, 32, 64 and 4,096 rows): the swap-AB GEMM
# is the fastest at one to 16 rows (0.56-0.80 of the copy rate; 145-147 us over the five
# projections, where the GEMV and decode GEMM take 172-175 and cuBLAS 174-183) and, with x
# quantized before the launch, at 32 rows (159 us, cuBLAS 199); cuBLAS from 33 rows on (199 us
# at 64 rows, swap-AB 215) and at 4,096 rows (1.37-1.57x bf16, about twice our prompt GEMM).
FP8_ROUTES: tuple[Fp8Route, ...] = (
    Fp8Route("swap_ab", max_rows=32),
    Fp8Route("cublas"),
)


def route_for(routes: tuple[Fp8Route, ...], m: int) -> Fp8Kernel:
    """The kernel of the first route holding M rows.

    Raises ValueError when no route holds M (a table without a catch-all last route).
    """
    for route in routes:
        if route.max_rows is None or m <= route.max_rows:
            return route.kernel
    raise ValueError(f"fp8 routes hold at most {routes[-1].max_rows} rows, got {m}: end them "
                     "with a route of max_rows None")  # fmt: skip
