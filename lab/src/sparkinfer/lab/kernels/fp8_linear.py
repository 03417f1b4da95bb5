"""FP8 GEMM benchmark: every FP8 kernel candidate at the 27B projections and the row counts the
dispatch table covers, each checked against its reference and timed beside cuBLAS's block-scaled
FP8 GEMM (`F.scaled_mm`, 1x128 activation and 128x128 weight blocks) and the bf16 dispatcher.

Candidates: our one-row GEMV, decode GEMM and swap-AB GEMM with the tiles `fp8_linear.tiles`
names, our prompt GEMM, cuBLAS (rows padded as `fp8_linear.cublas` pads them), the batch-invariant
kernel of the phase (what deterministic mode runs) and bf16. `picked` marks the kernel
`fp8_kernel_for` chooses at that row count; the dispatcher's own output is checked too. Each
row's rel_err is ||y - ref|| / ||ref|| against the dequantizing reference (bf16 activations) or
the prompt reference (activations quantized per token and group); ok: rel_err <= 1e-2.
Decode rows (M <= 64) are bound by the weight's bytes: `of_copy_bw` is the FP8 roofline (bytes
read, e4m3 weight plus scales plus x and y, over this run's copy rate); prompt rows report
TFLOP/s. A last row per shape lists the row counts cuBLAS takes without padding. Run alone:
``python -m sparkinfer.lab.kernels.fp8_linear [--quick]``; with JSON:
``sparkinfer-lab kernels --only fp8_linear --out DIR``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear import (
    fp8_gemm_cublas,
    fp8_gemm_decode,
    fp8_gemm_prompt,
    fp8_gemm_swap_ab,
    fp8_gemv,
    fp8_kernel_for,
    fp8_linear,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.dispatch import PROMPT_CONFIG
from sparkinfer.kernels.fp8_linear.routes import DECODE_MAX_ROWS
from sparkinfer.kernels.fp8_linear.tiles import decode_tile, gemv_tile, swap_ab_tile
from sparkinfer.kernels.linear import batch_invariant, linear
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
ROWS = (1, 8, 16, 32, 64, 4096)
QUICK_ROWS = (1, 16)
PROBE_ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 17, 24, 33)  # cuBLAS's acceptance, unpadded
REL_TOL = 1e-2

Row = dict[str, Any]
Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _invariant(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    with batch_invariant("decode" if x.shape[0] <= DECODE_MAX_ROWS else "prefill"):
        return fp8_linear(x, w, s)


def _candidates(m: int, n: int, k: int) -> list[tuple[str, str, Gemm, Gemm]]:
    """(impl, kernel name in the routes, op, reference) timed at M rows of an [N, K] weight."""
    out: list[tuple[str, str, Gemm, Gemm]] = []
    if m == 1:
        g = gemv_tile(n, k)
        out.append(("gemv", "gemv", lambda x, w, s: fp8_gemv(x, w, s, g), fp8_linear_ref))
    if m <= DECODE_MAX_ROWS:
        d, a = decode_tile(m, n, k), swap_ab_tile(m, n, k)
        out.append(("decode_gemm", "decode", lambda x, w, s: fp8_gemm_decode(x, w, s, d),
                    fp8_linear_ref))  # fmt: skip
        out.append(("swap_ab", "swap_ab", lambda x, w, s: fp8_gemm_swap_ab(x, w, s, a),
                    fp8_linear_prompt_ref))  # fmt: skip
    if m >= 16:
        out.append(("prompt_gemm", "prompt",
                    lambda x, w, s: fp8_gemm_prompt(x, w, s, PROMPT_CONFIG),
                    fp8_linear_prompt_ref))  # fmt: skip
    out.append(("cublas_blockwise", "cublas", fp8_gemm_cublas, fp8_linear_prompt_ref))
    inv_ref = fp8_linear_ref if m <= DECODE_MAX_ROWS else fp8_linear_prompt_ref
    out.append(("invariant (deterministic)", "-", _invariant, inv_ref))
    return out


def _figures(m: int, n: int, k: int, ms: float, copy: float, is_bf16: bool) -> Row:
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128)) + 2 * m * (k + n)
    if is_bf16:
        nbytes = 2 * n * k + 2 * m * (k + n)
    return {
        "median_ms": ms,
        "of_copy_bw": nbytes / (ms / 1e3) / copy,
        "TFLOP/s": 2 * m * n * k / ms / 1e9,
    }


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30)).item()


def _probe(op: str, n: int, k: int, w: torch.Tensor, s: torch.Tensor) -> Row:
    """The row counts cuBLAS's block-scaled GEMM takes without padding."""
    taken, refused = [], []
    for m in PROBE_ROWS:
        x_q, x_s = quantize_activation_fp8(torch.randn(m, k, device=w.device, dtype=torch.bfloat16))
        try:
            F.scaled_mm(x_q, w.t(), x_s, F.ScalingType.BlockWise1x128, s.t(),
                        F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)  # fmt: skip
            torch.cuda.synchronize()
            taken.append(m)
        except RuntimeError:
            refused.append(m)
    return {"op": op, "impl": "cublas_blockwise unpadded", "shape": f"N={n} K={k}",
            "taken": str(taken), "refused": str(refused)}  # fmt: skip


def _bench_rows(op: str, m: int, n: int, k: int, w16s, weights, copy: float, args) -> list[Row]:
    x = torch.randn(m, k, device=w16s[0].device, dtype=torch.bfloat16)
    w0, s0 = weights[0]
    picked = fp8_kernel_for(x, w0, s0)
    refs: dict[Gemm, torch.Tensor] = {}
    base = {"op": op, "M": m, "shape": f"M={m} N={n} K={k}"}
    rows: list[Row] = []
    for impl, kernel, fn, ref in _candidates(m, n, k):
        row: Row = {**base, "impl": impl, "picked": kernel == picked}
        try:
            if ref not in refs:
                refs[ref] = ref(x, w0, s0)
            err = _rel_err(fn(x, w0, s0), refs[ref])
            t = time_graph([lambda ws=ws, fn=fn: fn(x, *ws) for ws in weights],
                           warmup=args.warmup, iters=args.iters)  # fmt: skip
        except (RuntimeError, ValueError, TypeError) as e:  # a refused layout, a failed build
            rows.append({**row, "error": f"{type(e).__name__}: {str(e)[:60]}"})
            continue
        row |= _figures(m, n, k, t.median_ms, copy, is_bf16=False)
        rows.append({**row, "rel_err": err, "ok": err <= REL_TOL})
        print(f"fp8_linear: {op} M={m} {impl}: {t.median_ms * 1e3:.1f} us, "
              f"{row['of_copy_bw']:.3f} of copy, rel_err {err:.1e}", flush=True)  # fmt: skip
    is_bf16_x = picked in ("gemv", "decode")
    dispatch_ref = refs.get(fp8_linear_ref if is_bf16_x else fp8_linear_prompt_ref)
    if dispatch_ref is not None:
        err = _rel_err(fp8_linear(x, w0, s0), dispatch_ref)
        rows.append({**base, "impl": f"fp8_linear -> {picked}", "rel_err": err,
                     "ok": err <= REL_TOL})  # fmt: skip
    t = time_graph([lambda w=w: linear(x, w) for w in w16s], warmup=args.warmup, iters=args.iters)
    rows.append({**base, "impl": "bf16 dispatcher", **_figures(m, n, k, t.median_ms, copy, True)})
    print(f"fp8_linear: {op} M={m} bf16: {t.median_ms * 1e3:.1f} us", flush=True)
    return rows


def bench(device: torch.device, args: KernelBenchArgs) -> list[Row]:
    copy = copy_bandwidth(device)
    rows: list[Row] = []
    for op, n, k in SHAPES[:1] if args.is_quick else SHAPES:
        w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        weights = [quantize_weight_fp8(w16) for _ in range(rotation_copies(n * k))]
        w16s = [w16.clone() for _ in range(rotation_copies(2 * n * k))]
        rows.append(_probe(op, n, k, *weights[0]))
        for m in QUICK_ROWS if args.is_quick else ROWS:
            rows += _bench_rows(op, m, n, k, w16s, weights, copy, args)
        del weights, w16s, w16
        torch.cuda.empty_cache()
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, args)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=20).parse_args(), __doc__)


if __name__ == "__main__":
    main()
