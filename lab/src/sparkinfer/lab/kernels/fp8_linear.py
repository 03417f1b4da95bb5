"""FP8 GEMM benchmark: the block-scaled e4m3 decode and prompt GEMMs at the 27B projections,
beside cuBLAS's FP8 GEMM (torch's `F.scaled_mm`, 1x128 activation and 128x128 weight blocks:
what a user could script) and the bf16 dispatcher on the same shapes.

Decode rows (M <= 64) are bound by the weight's bytes: `of_copy_bw` is the FP8 roofline (bytes
actually read, e4m3 weight plus scales plus x and y, over this run's copy rate). Prompt rows
report TFLOP/s. Each row's max_abs_err is against the dequantizing reference (decode) or the
prompt reference (activations quantized per token and group). Run alone:
``python -m sparkinfer.lab.kernels.fp8_linear [--quick]``.
"""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.kernels.fp8_linear import (
    fp8_linear,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.linear import linear
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import copy_bandwidth, rotation_copies, time_graph

# (name, N, K) of the 27B projections: GDN in_proj_qkv+z, attention qkv, gate_up, down, o/out.
SHAPES = (
    ("gdn_in_proj", 16384, 5120),
    ("attn_qkv", 14336, 5120),
    ("gate_up", 34816, 5120),
    ("down", 5120, 17408),
    ("out_proj", 5120, 6144),
)
DECODE_ROWS = (1, 8, 32, 64)
PROMPT_ROWS = (4096,)

Row = dict[str, Any]


def _scaled_mm(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """cuBLAS blockwise FP8 GEMM: x quantized per token and 128 columns, the weight's 128x128
    block scales; scale layouts as torch's blockwise tests pass them (outer dim major)."""
    import torch.nn.functional as F

    xq, xs = quantize_activation_fp8(x)
    m, kb = xs.shape
    xs_outer = torch.empty_strided((m, kb), (1, m), dtype=xs.dtype, device=xs.device)
    xs_outer.copy_(xs)  # column-major even at one row (where .contiguous() keeps the strides)
    return F.scaled_mm(
        xq,
        w.t(),
        xs_outer,
        F.ScalingType.BlockWise1x128,
        ws.t(),  # [K/128, N/128], the layout of w.t()
        F.ScalingType.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )


def _row(op: str, impl: str, m: int, n: int, k: int, t, copy: float, err: float | None) -> Row:
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128)) + 2 * m * (k + n)
    if impl.startswith("bf16"):
        nbytes = 2 * n * k + 2 * m * (k + n)
    row: Row = {
        "op": op, "impl": impl, "shape": f"M={m} N={n} K={k}",
        "dtype": "bf16" if impl.startswith("bf16") else "e4m3",
        "median_ms": t.median_ms, "p90_ms": t.p90_ms,
        "GB/s": nbytes / t.median_ms / 1e6, "of_copy_bw": nbytes / (t.median_ms / 1e3) / copy,
        "TFLOP/s": 2 * m * n * k / t.median_ms / 1e9,
    }  # fmt: skip
    if err is not None:
        row["max_abs_err"] = err
    return row


def _impls(m: int) -> list[tuple[str, Any, Any]]:
    """(impl, op, reference) timed at M rows."""
    fast = fp8_linear  # the dispatcher: GEMV at one row, decode GEMM to 64, prompt GEMM beyond
    ref = fp8_linear_ref if m <= 64 else fp8_linear_prompt_ref
    return [
        ("fast", fast, ref),
        ("cublas_fp8 (scaled_mm)", _scaled_mm, fp8_linear_prompt_ref),
        ("bf16 dispatcher", None, None),
    ]


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    copy = copy_bandwidth(device)
    rows: list[Row] = []
    shapes = SHAPES[:1] if is_quick else SHAPES
    for op, n, k in shapes:
        w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        copies = rotation_copies(n * k)
        weights = [quantize_weight_fp8(w16) for _ in range(copies)]
        for m in (1, 32) if is_quick else (*DECODE_ROWS, *PROMPT_ROWS):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            for impl, fn, ref in _impls(m):
                if fn is None:
                    w16s = [w16.clone() for _ in range(copies)]
                    t = time_graph([lambda w=w, x=x: linear(x, w) for w in w16s], warmup=warmup,
                                   iters=iters)  # fmt: skip
                    rows.append(_row(op, impl, m, n, k, t, copy, None))
                    del w16s
                    continue
                try:
                    out = fn(x, *weights[0])
                except (RuntimeError, ValueError, TypeError) as e:  # scaled_mm: no such layout
                    rows.append({"op": op, "impl": impl, "shape": f"M={m} N={n} K={k}",
                                 "error": f"{type(e).__name__}: {str(e)[:80]}"})  # fmt: skip
                    continue
                err = (out.float() - ref(x, *weights[0]).float()).abs().max().item()
                calls = [lambda ws=ws, fn=fn, x=x: fn(x, *ws) for ws in weights]
                t = time_graph(calls, warmup=warmup, iters=iters)
                rows.append(_row(op, impl, m, n, k, t, copy, err))
        del weights, w16
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=20).parse_args(), __doc__)


if __name__ == "__main__":
    main()
